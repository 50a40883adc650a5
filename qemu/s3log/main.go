// Command s3log forwards HTTP requests to an S3 server and writes one
// line for each that the server answered, "METHOD PATH STATUS", to a log
// file as soon as it has answered: for the guest's test that a checkpoint
// with --to uploads while CRIU still dumps (qemu/criu-remote-test.sh),
// which no other tool in the guest can see.
//
//	s3log LISTEN TARGET LOG
//
// It prints "ready" once it listens. The Host header goes through as the
// client sent it, so its signatures hold.
package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: s3log LISTEN TARGET LOG")
		os.Exit(2)
	}
	target, err := url.Parse("http://" + os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "s3log:", err)
		os.Exit(2)
	}
	log, err := os.OpenFile(os.Args[3], os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "s3log:", err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "s3log:", err)
		os.Exit(1)
	}
	var mu sync.Mutex
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(r *http.Response) error {
		mu.Lock()
		defer mu.Unlock()
		_, err := fmt.Fprintf(log, "%s %s %d\n", r.Request.Method, r.Request.URL.Path, r.StatusCode)
		return err
	}
	fmt.Println("ready")
	fmt.Fprintln(os.Stderr, "s3log:", http.Serve(ln, proxy))
	os.Exit(1)
}
