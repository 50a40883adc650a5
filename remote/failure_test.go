package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// branches lists the branches of the mount at mnt.
func branches(t testing.TB, mnt string) []string {
	t.Helper()
	var infos []struct{ Name string }
	must(t, json.Unmarshal([]byte(ok(t, nil, "list", "--json", mnt)), &infos))
	var names []string
	for _, i := range infos {
		names = append(names, i.Name)
	}
	return names
}

// oneLineError checks that a command failed with status 1 and one line
// on standard error that holds each of wants.
func oneLineError(t testing.TB, r result, wants ...string) {
	t.Helper()
	if r.code != 1 {
		t.Errorf("exit %d, want 1 (stderr %q)", r.code, r.stderr)
	}
	if strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("stderr is not one line: %q", r.stderr)
	}
	for _, w := range wants {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr %q does not say %q", r.stderr, w)
		}
	}
}

// A pull onto a base that differs where the branch changed something is
// refused, naming those paths and no other, and makes no branch; --force
// makes it, with the branch's versions.
func TestPullOntoDifferentBase(t *testing.T) {
	w := sharedWeed(t)
	a, b := twoHosts(t)
	bucket := w.bucket(t)
	env := w.env()
	ok(t, nil, "create", "work", a.mnt)
	changeBranch(t, a.view("work"))
	url := push(t, env, a.view("work"), "s3://"+bucket+"/work").URL

	// The second host's base moved on: at three paths the branch
	// touched (one it changed, one it only chmodded, one it made), and
	// at one it did not touch, and inside a directory it deleted whole.
	must(t, os.WriteFile(filepath.Join(b.mnt, "mod"), []byte("changed on the second host\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(b.mnt, "chm"), []byte("changed on the second host\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(b.mnt, "ln"), []byte("made on the second host\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(b.mnt, "keep"), []byte("not the branch's business\n"), 0o644))
	must(t, os.Remove(filepath.Join(b.mnt, "deldir/a")))
	r := cli(t, env, "pull", url, b.mnt)
	oneLineError(t, r, "base differs", "at 3 paths", "mod: its content differs", "chm: its content differs",
		"ln: a file here, absent there", "--force")
	if strings.Contains(r.stderr, "keep") || strings.Contains(r.stderr, "deldir") {
		t.Errorf("the refusal names a path the branch did not touch: %s", r.stderr)
	}
	if slices.Contains(branches(t, b.mnt), "work") {
		t.Fatalf("a refused pull left branch work")
	}

	// Forced, the branch's versions replace those of the second base
	// where it touched them; elsewhere that base shows.
	ok(t, env, "pull", "--force", url, b.mnt)
	want, got := snapshot(t, a.view("work"), true), snapshot(t, b.view("work"), true)
	if data, err := os.ReadFile(filepath.Join(b.view("work"), "keep")); err != nil || string(data) != "not the branch's business\n" {
		t.Errorf("keep in the forced pull: %q, %v", data, err)
	}
	delete(want, "keep")
	delete(got, "keep")
	sameTrees(t, "forced pull", want, got)
}

// Missing credentials, refused ones, a missing bucket, an endpoint that
// does not answer and a URL with nothing pushed each fail with one line
// saying so, and leave no manifest and no branch.
func TestErrors(t *testing.T) {
	w := sharedWeed(t)
	a, b := twoHosts(t)
	bucket := w.bucket(t)
	ok(t, nil, "create", "work", a.mnt)
	changeBranch(t, a.view("work"))
	url := "s3://" + bucket + "/work"
	closed := freePorts(t, 1)[0]
	for _, c := range []struct {
		name  string
		env   []string
		url   string
		wants []string
	}{
		{"wrong secret key", w.env("AWS_SECRET_ACCESS_KEY=wrong"), url, []string{"refused the secret key", "SignatureDoesNotMatch"}},
		{"unknown access key", w.env("AWS_ACCESS_KEY_ID=nobody"), url, []string{"access key", "InvalidAccessKeyId"}},
		{"no credentials", w.env("AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY="), url, []string{"no AWS credentials found"}},
		{"missing bucket", w.env(), "s3://no-such-bucket-" + strconv.Itoa(os.Getpid()) + "/work", []string{"bucket no-such-bucket-", "does not exist at " + w.Endpoint}},
		{"unreachable endpoint", w.env("AWS_ENDPOINT_URL=http://127.0.0.1:" + strconv.Itoa(closed)), url, []string{"cannot reach http://127.0.0.1:" + strconv.Itoa(closed), "connection refused"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			oneLineError(t, cli(t, c.env, "push", a.view("work"), c.url), c.wants...)
			oneLineError(t, cli(t, c.env, "pull", c.url, b.mnt), c.wants...)
		})
	}
	if keys := w.keys(t, bucket, ""); len(keys) != 0 {
		t.Errorf("failed pushes left %v", keys)
	}
	oneLineError(t, cli(t, w.env(), "pull", url, b.mnt), "no branch was pushed to "+url)
	if slices.Contains(branches(t, b.mnt), "work") {
		t.Errorf("a failed pull left branch work")
	}
}

// A pull that fails on the way (here a chunk is missing from the bucket)
// aborts the branch it made: there is the whole branch or none.
func TestFailedPullLeavesNoBranch(t *testing.T) {
	w := sharedWeed(t)
	a, b := twoHosts(t)
	bucket := w.bucket(t)
	env := w.env()
	ok(t, nil, "create", "work", a.mnt)
	changeBranch(t, a.view("work"))
	url := push(t, env, a.view("work"), "s3://"+bucket+"/dir/work").URL
	chunks := w.keys(t, bucket, "dir/.chunks/")
	if len(chunks) < 2 {
		t.Fatalf("chunks: %v", chunks)
	}
	_, err := w.client().DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: &bucket, Key: &chunks[1]})
	must(t, err)
	oneLineError(t, cli(t, env, "pull", url, b.mnt), chunks[1], "no such object")
	if slices.Contains(branches(t, b.mnt), "work") {
		t.Fatalf("a failed pull left branch work")
	}
}

// A push whose server dies in the middle fails with one line and leaves
// no manifest; once the server is back, the same push goes on from the
// chunks already stored, and the branch pulls whole.
func TestPushResumesAfterTheServerDied(t *testing.T) {
	a, b := twoHosts(t)
	w := startWeed(t)
	p := newProxy(t, strings.TrimPrefix(w.Endpoint, "http://"))
	bucket := w.bucket(t)
	env := w.env("AWS_ENDPOINT_URL="+p.Endpoint(), "AWS_MAX_ATTEMPTS=2")
	ok(t, nil, "create", "big", a.mnt)
	for i := range 4 {
		must(t, os.WriteFile(filepath.Join(a.view("big"), "f"+strconv.Itoa(i)), randomBytes(8<<20, uint64(i+10)), 0o644))
	}
	url := "s3://" + bucket + "/big"

	held := p.holdAfter(12 << 20)
	cmd := exec.Command(binary, "push", "--jobs", "2", a.view("big"), url)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-held:
	case err := <-exited:
		t.Fatalf("push ended before 12 MiB reached the server: %v: %s", err, stderr.String())
	}
	w.kill()
	p.drop()
	if err := <-exited; err == nil {
		t.Fatal("push succeeded though its server died")
	}
	oneLineError(t, result{stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}, "push big to "+url, "is as it was")

	must(t, w.start())
	if slices.Contains(w.keys(t, bucket, ""), "big") {
		t.Fatal("the failed push left a manifest")
	}
	stored := len(w.keys(t, bucket, ".chunks/"))
	if stored == 0 {
		t.Fatal("no chunk reached the server before it died")
	}
	again := push(t, env, a.view("big"), url)
	if again.Stats.Stored != again.Stats.Chunks-stored {
		t.Errorf("the resumed push stored %d of %d chunks; %d were there", again.Stats.Stored, again.Stats.Chunks, stored)
	}
	ok(t, env, "pull", url, b.mnt)
	sameTrees(t, "pulled branch", snapshot(t, a.view("big"), true), snapshot(t, b.view("big"), true))
}

// Credentials and the endpoint come from a profile of the shared files,
// as the AWS tools read them; an endpoint over TLS is verified, and
// trusted through AWS_CA_BUNDLE.
func TestProfileAndTLS(t *testing.T) {
	w := sharedWeed(t)
	a, _ := twoHosts(t)
	bucket := w.bucket(t)
	ok(t, nil, "create", "work", a.mnt)
	changeBranch(t, a.view("work"))
	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials")
	conf := filepath.Join(dir, "config")
	must(t, os.WriteFile(creds, []byte("[ci]\naws_access_key_id = "+testKey+"\naws_secret_access_key = "+testSecret+"\n"), 0o600))
	must(t, os.WriteFile(conf, []byte("[profile ci]\nregion = us-east-1\nendpoint_url = "+w.Endpoint+"\n"), 0o600))
	env := append(w.env(), "AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_ENDPOINT_URL=",
		"AWS_PROFILE=ci", "AWS_SHARED_CREDENTIALS_FILE="+creds, "AWS_CONFIG_FILE="+conf)
	push(t, env, a.view("work"), "s3://"+bucket+"/by-profile")

	target, err := url.Parse(w.Endpoint)
	must(t, err)
	tls := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(target))
	tls.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	tls.StartTLS()
	defer tls.Close()
	tlsEnv := w.env("AWS_ENDPOINT_URL=" + tls.URL)
	oneLineError(t, cli(t, tlsEnv, "push", a.view("work"), "s3://"+bucket+"/over-tls"), "cannot verify the TLS certificate of "+tls.URL)
	ca := filepath.Join(dir, "ca.pem")
	must(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tls.Certificate().Raw}), 0o600))
	push(t, append(tlsEnv, "AWS_CA_BUNDLE="+ca), a.view("work"), "s3://"+bucket+"/over-tls")
}
