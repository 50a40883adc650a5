package remote

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// The tests run against SeaweedFS (weed server -s3), started on loopback
// ports by the tests themselves: never a fake store. scripts/seaweedfs.sh
// builds weed once per version into a cache outside the checkout (about
// 20 minutes cold; make go-test runs it first) and prints its path; or
// BRANCHFS_WEED names a weed binary. BRANCHFS_SKIP_S3=1 skips these tests,
// and only it does.

const (
	testKey    = "branchfs-test-key"
	testSecret = "branchfs-test-secret"
)

var (
	weedOnce sync.Once
	weedBin  string
	weedErr  error
)

// weedBinary finds or builds weed, or skips the test when told to.
func weedBinary(t testing.TB) string {
	t.Helper()
	if os.Getenv("BRANCHFS_SKIP_S3") != "" {
		t.Skip("BRANCHFS_SKIP_S3 is set: skipping the tests against SeaweedFS")
	}
	weedOnce.Do(func() {
		if weedBin = os.Getenv("BRANCHFS_WEED"); weedBin != "" {
			return
		}
		cmd := exec.Command("../scripts/seaweedfs.sh")
		cmd.Stderr = os.Stderr // says when it builds, which takes long
		out, err := cmd.Output()
		if err != nil {
			weedErr = fmt.Errorf("scripts/seaweedfs.sh: %w", err)
			return
		}
		weedBin = strings.TrimSpace(string(out))
	})
	if weedErr != nil {
		t.Fatal(weedErr)
	}
	return weedBin
}

// weed is a SeaweedFS server with its master, volume server, filer and S3
// gateway in one process, on loopback ports (scripts/seaweedfs.sh serve),
// with one identity.
type weed struct {
	bin, dir string
	port     int // S3's; the others follow it
	cmd      *exec.Cmd
	exited   chan struct{}
	Endpoint string
}

// startWeed starts a server of its own for t, stopped when t ends.
func startWeed(t testing.TB) *weed {
	t.Helper()
	w := newWeed(t)
	t.Cleanup(w.stop)
	return w
}

func newWeed(t testing.TB) *weed {
	bin := weedBinary(t)
	// Outside /tmp: the server runs with a private /tmp.
	dir, err := os.MkdirTemp("/var/tmp", "branchfs-weed-")
	if err != nil {
		t.Fatal(err)
	}
	w := &weed{bin: bin, dir: dir, port: freePortRun(t, 8)}
	w.Endpoint = "http://127.0.0.1:" + strconv.Itoa(w.port)
	if err := w.start(); err != nil {
		w.stop()
		t.Fatal(err)
	}
	return w
}

// start runs the server and waits until its S3 gateway answers.
func (w *weed) start() error {
	w.cmd = exec.Command("../scripts/seaweedfs.sh", "serve", w.dir, strconv.Itoa(w.port), testKey, testSecret)
	w.cmd.Env = append(os.Environ(), "BRANCHFS_WEED="+w.bin)
	if err := os.MkdirAll(filepath.Join(w.dir, "log"), 0o700); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(w.dir, "log", "weed.out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	w.cmd.Stdout, w.cmd.Stderr = out, out
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := w.cmd.Start(); err != nil {
		return err
	}
	w.exited = make(chan struct{})
	go func() { w.cmd.Wait(); close(w.exited) }()
	// Ready once it stores an object: after a restart its gateway
	// answers listings before its volumes take writes again.
	c := w.client()
	deadline := time.Now().Add(2 * time.Minute)
	probe := "branchfs-weed-ready"
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &probe})
		var owned *types.BucketAlreadyOwnedByYou
		if err == nil || errors.As(err, &owned) {
			_, err = c.PutObject(ctx, &s3.PutObjectInput{Bucket: &probe, Key: &probe, Body: strings.NewReader("ready")})
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-w.exited:
			log, _ := os.ReadFile(filepath.Join(w.dir, "log", "weed.out"))
			return fmt.Errorf("weed server exited: %s", lastLines(string(log), 5))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("weed server did not answer on %s in 2 minutes: %v", w.Endpoint, err)
		}
	}
}

// kill ends the server at once, as a crash would.
func (w *weed) kill() {
	if w.cmd != nil && w.cmd.Process != nil {
		syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
		<-w.exited
	}
}

func (w *weed) stop() {
	w.kill()
	os.RemoveAll(w.dir)
}

// client is an S3 client of the server, for the tests' own requests.
func (w *weed) client() *s3.Client {
	return s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(w.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(testKey, testSecret, ""),
	})
}

// bucket makes a bucket named after the test.
func (w *weed) bucket(t testing.TB) string {
	t.Helper()
	name := strings.ToLower(t.Name())
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
	name = strings.Trim(name[:min(len(name), 50)], "-") + "-" + strconv.Itoa(os.Getpid()%10000)
	_, err := w.client().CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: &name})
	if err != nil {
		t.Fatalf("creating bucket %s: %v", name, err)
	}
	return name
}

// env is the environment a branchfs command needs to reach the server:
// the AWS tools' variables, and no configuration files of the machine's.
func (w *weed) env(extra ...string) []string {
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	return append(append(env,
		"AWS_ACCESS_KEY_ID="+testKey, "AWS_SECRET_ACCESS_KEY="+testSecret, "AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL="+w.Endpoint, "AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=/nonexistent", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent"), extra...)
}

// connect reaches bucket through endpoint (the server's, or a proxy's)
// from this test's own process, with the environment env gives commands.
func (w *weed) connect(t testing.TB, bucket, endpoint string) *Bucket {
	t.Helper()
	for _, kv := range w.env() {
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "AWS_") {
			t.Setenv(k, v)
		}
	}
	t.Setenv("AWS_ENDPOINT_URL", endpoint)
	b, err := Connect(context.Background(), bucket)
	must(t, err)
	return b
}

// keys lists the keys in bucket under prefix.
func (w *weed) keys(t testing.TB, bucket, prefix string) []string {
	t.Helper()
	var keys []string
	p := s3.NewListObjectsV2Paginator(w.client(), &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix})
	for p.HasMorePages() {
		out, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range out.Contents {
			keys = append(keys, *o.Key)
		}
	}
	return keys
}

// freePorts finds n ports on loopback that nothing listens on.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// freePortRun finds n consecutive ports on loopback that nothing listens
// on, and returns the first.
func freePortRun(t testing.TB, n int) int {
	t.Helper()
	for range 100 {
		base := 20000 + rand.IntN(40000)
		var ls []net.Listener
		for p := base; p < base+n; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if len(ls) == n {
			return base
		}
	}
	t.Fatalf("no %d free ports in a row", n)
	return 0
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// proxy forwards connections to a server and, once told to, holds what
// it forwards until dropped: a test can stop a transfer in the middle,
// kill the server and then drop every connection.
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	budget int64         // bytes still forwarded to the server; <0: no limit
	held   chan struct{} // closed when the budget is spent
}

func newProxy(t testing.TB, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, budget: -1}
	go p.serve()
	t.Cleanup(func() { l.Close(); p.drop() })
	return p
}

func (p *proxy) Endpoint() string { return "http://" + p.l.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(s, c, true)
		go p.pipe(c, s, false)
	}
}

// pipe copies src to dst. What goes to the server spends the budget; once
// it is spent, pipe stops reading and leaves the connection open.
func (p *proxy) pipe(dst, src net.Conn, toServer bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if toServer {
			p.mu.Lock()
			if p.budget >= 0 {
				n = int(min(int64(n), p.budget))
				p.budget -= int64(n)
				if p.budget == 0 && p.held != nil {
					close(p.held)
					p.held = nil
				}
			}
			hold := p.budget == 0
			p.mu.Unlock()
			if hold {
				if n > 0 {
					dst.Write(buf[:n])
				}
				return
			}
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// holdAfter lets n more bytes reach the server and returns a channel
// closed once they have.
func (p *proxy) holdAfter(n int64) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.budget = n
	p.held = make(chan struct{})
	return p.held
}

// drop closes every connection and forwards again without limit.
func (p *proxy) drop() {
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.budget = -1
	p.mu.Unlock()
}
