package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// peekParentMode is a compromised worker: it tries to read its agent's
// memory through /proc/PPID/mem, as one of the same user could read the
// node's keys there, and prints what it got:
//
//	peek ppid=P maps=ERR|ok addr=A
//	peek ppid=P read N bytes: HEX   (it could)
//	peek ppid=P open|read: ERR      (it could not)
func peekParentMode() error {
	ppid := os.Getppid()
	// The first readable mapping of the agent; without its maps (they are
	// as closed as its memory), the usual base of a Go executable.
	addr, mapsErr := uint64(0x400000), "ok"
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", ppid)); err != nil {
		mapsErr = err.Error()
	} else if a, ok := firstReadable(b); ok {
		addr = a
	}
	fmt.Printf("peek ppid=%d maps=%q addr=%#x\n", ppid, mapsErr, addr)
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", ppid))
	if err != nil {
		fmt.Printf("peek ppid=%d open: %v\n", ppid, err)
		return nil
	}
	defer f.Close()
	buf := make([]byte, 16)
	n, err := f.ReadAt(buf, int64(addr))
	if err != nil && n == 0 {
		fmt.Printf("peek ppid=%d read: %v\n", ppid, err)
		return nil
	}
	fmt.Printf("peek ppid=%d read %d bytes: %x\n", ppid, n, buf[:n])
	return nil
}

// firstReadable returns the start of the first readable mapping in a
// /proc/PID/maps listing.
func firstReadable(maps []byte) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !strings.HasPrefix(f[1], "r") {
			continue
		}
		start, _, _ := strings.Cut(f[0], "-")
		if a, err := strconv.ParseUint(start, 16, 64); err == nil {
			return a, true
		}
	}
	return 0, false
}
