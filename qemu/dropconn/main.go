// Command dropconn forwards TCP connections to a server until the server
// has sent a number of bytes in all, then drops every connection (a
// reset, as when a link goes) and refuses new ones: a connection lost in
// the middle of a transfer, for the guest's remote restore test
// (qemu/criu-remote-test.sh), where no other tool can cut one.
//
//	dropconn LISTEN TARGET BYTES
//
// It prints "ready" once it listens, and "dropped" as it exits once it
// has dropped them.
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
)

type cutter struct {
	mu     sync.Mutex
	budget int64 // bytes the server may still send
	conns  []*net.TCPConn
	ln     net.Listener
	done   chan struct{}
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: dropconn LISTEN TARGET BYTES")
		os.Exit(2)
	}
	budget, err := strconv.ParseInt(os.Args[3], 10, 64)
	if err != nil || budget < 0 {
		fmt.Fprintf(os.Stderr, "dropconn: bad byte count %q\n", os.Args[3])
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "dropconn:", err)
		os.Exit(1)
	}
	c := &cutter{budget: budget, ln: ln, done: make(chan struct{})}
	fmt.Println("ready")
	go c.serve(os.Args[2])
	<-c.done
	fmt.Println("dropped")
}

func (c *cutter) serve(target string) {
	for {
		client, err := c.ln.Accept()
		if err != nil {
			return // closed: dropped
		}
		server, err := net.Dial("tcp", target)
		if err != nil {
			client.Close()
			continue
		}
		c.mu.Lock()
		c.conns = append(c.conns, client.(*net.TCPConn), server.(*net.TCPConn))
		c.mu.Unlock()
		go io.Copy(server, client)
		go c.fromServer(client, server)
	}
}

// fromServer copies what the server sends, spending the budget; the
// byte that would overspend it drops everything instead.
func (c *cutter) fromServer(client, server net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		c.mu.Lock()
		k := min(int64(n), c.budget)
		c.budget -= k
		spent := c.budget == 0 && int64(n) > k
		c.mu.Unlock()
		if k > 0 {
			if _, werr := client.Write(buf[:k]); werr != nil {
				return
			}
		}
		if spent {
			c.drop()
			return
		}
		if err != nil {
			client.Close()
			return
		}
	}
}

// drop resets every connection and stops listening, once.
func (c *cutter) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.done:
		return
	default:
	}
	c.ln.Close()
	for _, conn := range c.conns {
		conn.SetLinger(0) // a reset, not an orderly end
		conn.Close()
	}
	close(c.done)
}
