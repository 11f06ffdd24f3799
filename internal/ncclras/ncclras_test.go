package ncclras

import (
	"bufio"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fakeRAS serves one client the way NCCL's RAS thread does.
func fakeRAS(t *testing.T, report string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		r := bufio.NewReader(conn)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			switch l = strings.TrimSpace(l); {
			case strings.HasPrefix(l, "CLIENT PROTOCOL"):
				conn.Write([]byte("SERVER PROTOCOL 2\n"))
			case strings.HasPrefix(l, "TIMEOUT"), l == "SET FORMAT json":
				conn.Write([]byte("OK\n"))
			case strings.HasSuffix(l, "STATUS"):
				conn.Write([]byte(report))
				return
			default:
				conn.Write([]byte("ERROR unknown command\n"))
				return
			}
		}
	}()
	return ln.Addr().String()
}

const textReport = `Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      1          2            1          2        2

Errors
======

DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 4242 on node 10.0.0.2 managing GPU 1

Warnings
========

  Communicator ranks have different collective operation counts
`

func TestQueryText(t *testing.T) {
	addr := fakeRAS(t, textReport)
	rep, err := Query(t.Context(), addr, Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"DEAD", "1 job process is considered dead (unreachable via the RAS network)",
		"Process 4242 on node 10.0.0.2 managing GPU 1", "Communicator ranks have different collective operation counts"}
	if rep.ServerProtocol != 2 || !reflect.DeepEqual(rep.Problems, want) || rep.Raw != textReport {
		t.Errorf("report: protocol %d problems %q", rep.ServerProtocol, rep.Problems)
	}
}

func TestQueryJSON(t *testing.T) {
	addr := fakeRAS(t, `{"job":{"nodes":1},"errors":[{"kind":"DEAD","pid":4242}],"communicators":[{"warnings":["rank 1 missing"]}]}`)
	rep, err := Query(t.Context(), addr, Options{Format: "json", Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`rank 1 missing`, `{"kind":"DEAD","pid":4242}`}
	if !reflect.DeepEqual(rep.Problems, want) {
		t.Errorf("problems %q, want %q", rep.Problems, want)
	}
}

func TestQueryNotRAS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("HTTP/1.1 400 Bad Request\n"))
			c.Close()
		}
	}()
	if _, err := Query(t.Context(), ln.Addr().String(), Options{}); err == nil || !strings.Contains(err.Error(), "unexpected answer") {
		t.Errorf("err = %v", err)
	}
}

func FuzzProblems(f *testing.F) {
	f.Add(textReport)
	f.Add(`{"errors":[1,"x",{"a":null}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		_ = problemsText(s)
		_, _ = problemsJSON([]byte(s))
	})
}
