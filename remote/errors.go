package remote

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
)

// explain turns an error of the S3 client into one line that says what
// went wrong in the user's terms (a missing bucket, refused credentials,
// an endpoint out of reach) and names the object and the endpoint. The
// cause stays reachable with errors.Is and errors.As.
func (b *Bucket) explain(what string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var api smithy.APIError
	var dns *net.DNSError
	var op *net.OpError
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	switch {
	case errors.As(err, &api):
		switch code := api.ErrorCode(); code {
		case "NoSuchBucket":
			return &Error{fmt.Sprintf("bucket %s does not exist at %s", b.name, b.endpoint), err}
		case "NoSuchKey", "NotFound":
			if status(err) == 404 && what == "s3://"+b.name {
				return &Error{fmt.Sprintf("bucket %s does not exist at %s", b.name, b.endpoint), err}
			}
			return &Error{fmt.Sprintf("%s: no such object", what), errors.Join(errNotFound, err)}
		case "InvalidAccessKeyId":
			return &Error{fmt.Sprintf("%s refused the access key ID (InvalidAccessKeyId): check AWS_ACCESS_KEY_ID or the profile's credentials", b.endpoint), err}
		case "SignatureDoesNotMatch":
			return &Error{fmt.Sprintf("%s refused the secret key (SignatureDoesNotMatch): check AWS_SECRET_ACCESS_KEY or the profile's credentials", b.endpoint), err}
		case "ExpiredToken", "TokenRefreshRequired":
			return &Error{fmt.Sprintf("%s: the session token has expired (%s): renew AWS_SESSION_TOKEN or the profile's credentials", b.endpoint, code), err}
		case "AccessDenied", "Forbidden", "AllAccessDisabled":
			return &Error{fmt.Sprintf("%s denied access to %s (%s): the credentials are wrong or lack the permission", b.endpoint, what, code), err}
		}
		if s := status(err); s == 403 {
			return &Error{fmt.Sprintf("%s denied access to %s (HTTP 403): the credentials are wrong or lack the permission", b.endpoint, what), err}
		} else if s == 404 && what == "s3://"+b.name {
			return &Error{fmt.Sprintf("bucket %s does not exist at %s", b.name, b.endpoint), err}
		}
		return &Error{fmt.Sprintf("%s: %s: %s", what, api.ErrorCode(), oneLine(errors.New(api.ErrorMessage()))), err}
	case errors.As(err, &unknownCA), errors.As(err, &badHost):
		return &Error{fmt.Sprintf("cannot verify the TLS certificate of %s (AWS_CA_BUNDLE names a CA bundle to trust): %v", b.endpoint, oneLine(err)), err}
	case errors.As(err, &dns):
		return &Error{fmt.Sprintf("cannot reach %s: no such host %s", b.endpoint, dns.Name), err}
	case errors.As(err, &op) && op.Op == "dial":
		return &Error{fmt.Sprintf("cannot reach %s: %v", b.endpoint, op.Err), err}
	case errors.As(err, &op):
		return &Error{fmt.Sprintf("the connection to %s failed (%s): %v", b.endpoint, what, op.Err), err}
	}
	return &Error{fmt.Sprintf("%s: %v", what, oneLine(err)), err}
}

// status is the HTTP status of an error response, or 0.
func status(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.Response != nil {
		return re.Response.StatusCode
	}
	return 0
}

func isNotFound(err error) bool {
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "NoSuchKey", "NotFound":
			return true
		}
	}
	return status(err) == 404
}

// Error is an S3 failure told in one line; Unwrap gives the client's error.
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.err }

// oneLine keeps the last, most specific part of a wrapped error of the
// AWS client ("operation error S3: PutObject, https response error
// StatusCode: 500, RequestID: ..., api error X: msg") on one line.
func oneLine(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	if i := strings.LastIndex(s, "api error "); i >= 0 {
		s = s[i+len("api error "):]
	}
	return s
}
