package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/logging"
)

// Location is an object's place: s3://BUCKET/KEY.
type Location struct {
	Bucket string
	Key    string
}

// ParseURL reads s3://BUCKET/KEY. KEY may be empty or end in "/", where a
// push puts the branch under its own name (Location.Under).
func ParseURL(s string) (Location, error) {
	rest, ok := strings.CutPrefix(s, "s3://")
	if !ok {
		return Location{}, fmt.Errorf("%q is not an s3://BUCKET/KEY URL", s)
	}
	bucket, key, _ := strings.Cut(rest, "/")
	if bucket == "" {
		return Location{}, fmt.Errorf("%q names no bucket", s)
	}
	if strings.Contains(key, "//") || strings.HasPrefix(key, "/") {
		return Location{}, fmt.Errorf("%q: empty path component", s)
	}
	for _, c := range strings.Split(strings.TrimSuffix(key, "/"), "/") {
		if c == "." || c == ".." || c == chunkDir || c == workingSetDir {
			return Location{}, fmt.Errorf("%q: a path component may not be %q", s, c)
		}
	}
	return Location{bucket, key}, nil
}

func (l Location) String() string { return "s3://" + l.Bucket + "/" + l.Key }

// Under is l itself, or l/name where l ends in "/" or is the bucket.
func (l Location) Under(name string) Location {
	if l.Key == "" || strings.HasSuffix(l.Key, "/") {
		l.Key += name
	}
	return l
}

// chunkDir holds the chunks of every manifest in a directory.
const chunkDir = ".chunks"

// chunkKey is where chunk hash of a manifest at l lives.
func (l Location) chunkKey(hash string) string {
	dir := path.Dir(l.Key)
	if dir == "." {
		return chunkDir + "/" + hash
	}
	return dir + "/" + chunkDir + "/" + hash
}

// Bucket is a connection to one bucket, with the AWS tools' configuration:
// the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN, AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL and
// AWS_ENDPOINT_URL_S3, AWS_CA_BUNDLE, AWS_MAX_ATTEMPTS), the shared config
// and credentials files and their profiles. Its methods are safe for
// concurrent use; every error is one line (explain).
type Bucket struct {
	client   *s3.Client
	name     string
	endpoint string // for messages: the custom endpoint, or AWS's region
	// Bytes moved, for the summaries and the bench.
	sent, received atomic.Int64
	requests       atomic.Int64
}

// PathStyleEnv overrides the addressing style: "1" puts the bucket in the
// path (http://host/bucket/key), "0" in the host name. By default a custom
// endpoint, a self-hosted store's, gets the path, which needs no wildcard
// DNS; AWS's own endpoints get the host name.
const PathStyleEnv = "BRANCHFS_S3_PATH_STYLE"

// Connect configures a client for bucket as the AWS tools would, makes
// sure it has credentials, and checks that the bucket is there and
// answers them.
func Connect(ctx context.Context, bucket string) (*Bucket, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, &Error{"AWS configuration: " + oneLine(err), err}
	}
	if cfg.Region == "" {
		// S3 needs one to sign with; self-hosted stores take any.
		cfg.Region = "us-east-1"
	}
	b := &Bucket{name: bucket}
	b.client = s3.NewFromConfig(cfg, func(o *s3.Options) {
		custom := o.BaseEndpoint != nil
		o.UsePathStyle = custom
		switch os.Getenv(PathStyleEnv) {
		case "1":
			o.UsePathStyle = true
		case "0":
			o.UsePathStyle = false
		}
		if custom {
			b.endpoint = *o.BaseEndpoint
		} else {
			b.endpoint = "AWS S3 in " + o.Region
		}
		// Chunks are named by their SHA-256 and checked against it when
		// read; a checksum trailer would also need the store to take
		// aws-chunked bodies, which not every self-hosted one does.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		// The client logs to standard error by itself; the commands
		// say what matters in one line.
		o.Logger = logging.Nop{}
		o.ClientLogMode = 0
	})
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return nil, fmt.Errorf("no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or write ~/.aws/credentials): %s", oneLine(err))
	}
	// A listing, not a HEAD: an error answer to a HEAD has no body, so
	// it cannot tell a wrong secret from an unknown key or a missing
	// permission. Both need the permission to list the bucket, which a
	// push needs anyway: without it a HEAD of a missing chunk answers 403.
	one := int32(1)
	if _, err := b.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &b.name, MaxKeys: &one}); err != nil {
		return nil, b.explain("s3://"+bucket, err)
	}
	return b, nil
}

// Stat returns the size of the object at key, and whether it exists.
func (b *Bucket) Stat(ctx context.Context, key string) (int64, bool, error) {
	b.requests.Add(1)
	out, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.name, Key: &key})
	if err != nil {
		if isNotFound(err) {
			return 0, false, nil
		}
		return 0, false, b.explain(b.url(key), err)
	}
	return aws.ToInt64(out.ContentLength), true, nil
}

// Put stores data at key, whole or not at all.
func (b *Bucket) Put(ctx context.Context, key string, data []byte) error {
	b.requests.Add(1)
	_, err := b.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &b.name, Key: &key, Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
	})
	if err != nil {
		return b.explain(b.url(key), err)
	}
	b.sent.Add(int64(len(data)))
	return nil
}

// Get reads the object at key whole.
func (b *Bucket) Get(ctx context.Context, key string) ([]byte, error) {
	return b.get(ctx, key, "", -1)
}

// GetRange reads n bytes at off of the object at key.
func (b *Bucket) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	return b.get(ctx, key, "bytes="+strconv.FormatInt(off, 10)+"-"+strconv.FormatInt(off+n-1, 10), n)
}

func (b *Bucket) get(ctx context.Context, key, rng string, n int64) ([]byte, error) {
	in := &s3.GetObjectInput{Bucket: &b.name, Key: &key}
	if rng != "" {
		in.Range = &rng
	}
	b.requests.Add(1)
	out, err := b.client.GetObject(ctx, in)
	if err != nil {
		return nil, b.explain(b.url(key), err)
	}
	defer out.Body.Close()
	size := aws.ToInt64(out.ContentLength)
	if n >= 0 && size != n {
		return nil, fmt.Errorf("%s: asked for %d bytes (%s), the store answered %d", b.url(key), n, rng, size)
	}
	data := make([]byte, 0, max(size, 0))
	buf := bytes.NewBuffer(data)
	if _, err := io.Copy(buf, out.Body); err != nil {
		return nil, b.explain(b.url(key), err)
	}
	b.received.Add(int64(buf.Len()))
	if size >= 0 && int64(buf.Len()) != size {
		return nil, fmt.Errorf("%s: the connection ended after %d of %d bytes", b.url(key), buf.Len(), size)
	}
	return buf.Bytes(), nil
}

// Delete removes the object at key (a test's or a failed push's).
func (b *Bucket) Delete(ctx context.Context, key string) error {
	b.requests.Add(1)
	if _, err := b.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.name, Key: &key}); err != nil {
		return b.explain(b.url(key), err)
	}
	return nil
}

// Moved returns the bytes sent and received, and the requests made, so far.
func (b *Bucket) Moved() (sent, received, requests int64) {
	return b.sent.Load(), b.received.Load(), b.requests.Load()
}

// Endpoint names where the bucket is, for messages.
func (b *Bucket) Endpoint() string { return b.endpoint }

func (b *Bucket) url(key string) string { return "s3://" + b.name + "/" + key }

// errNotFound marks an object that is not there.
var errNotFound = errors.New("no such object")

// IsNotFound reports whether err says an object is not there.
func IsNotFound(err error) bool { return errors.Is(err, errNotFound) }
