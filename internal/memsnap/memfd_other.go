//go:build !linux

package memsnap

import (
	"errors"
	"net"
)

var errNoMemfd = errors.New("memsnap: in-memory snapshots need Linux (memfd)")

func createMemfd(string, int64) (int, error) { return -1, errNoMemfd }
func mapWritable(int, int64) ([]byte, error) { return nil, errNoMemfd }
func mapReadOnly(int, int64) ([]byte, error) { return nil, errNoMemfd }
func unmap([]byte)                           {}
func seal(int) error                         { return errNoMemfd }
func sealed(int) bool                        { return false }
func fileSize(int) (int64, error)            { return 0, errNoMemfd }
func closeFd(int)                            {}
func dupFd(int) (int, error)                 { return -1, errNoMemfd }
func peerPid(*net.UnixConn) int              { return 0 }

// TotalMemory is the node's memory in bytes; 0 if unknown.
func TotalMemory() int64 { return 0 }
