//go:build linux

package memsnap

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// createMemfd returns a new sealable memfd of size bytes.
func createMemfd(name string, size int64) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("create a memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("size the memfd to %d bytes: %w", size, err)
	}
	return fd, nil
}

// mapWritable maps fd's size bytes shared and writable, with the pages
// allocated and mapped writable now, so that the copy into them does not
// fault.
func mapWritable(fd int, size int64) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	b, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the memfd (%d bytes): %w", size, err)
	}
	// MAP_POPULATE maps a shared mapping's pages read-only, so each first
	// write would still fault; populate them writable (Linux 5.14), or
	// touch every page where the kernel cannot.
	if unix.Madvise(b, unix.MADV_POPULATE_WRITE) != nil {
		for i := 0; i < len(b); i += 4096 {
			b[i] = 0
		}
	}
	return b, nil
}

// mapReadOnly maps fd's size bytes read-only, its page tables filled now
// (MAP_POPULATE): the checksum pass and the restore's copy then read at
// memory speed instead of taking a fault per 4 KiB page, which made a
// restore of a fresh mapping several times slower. A memfd not yet sealed
// is mapped private: a read-only shared mapping of a read-write memfd could
// be made writable (mprotect), so the kernel would refuse to seal the memfd
// while it exists (Store.Seal); a private one that is never written reads
// the same pages. A sealed one is mapped shared: the CUDA driver page-locks
// a shared mapping ~10x faster than a private one (12 GiB: 0.6 s against
// 6.7 s on an H200 host), and nothing can be sealed any more anyway.
func mapReadOnly(fd int, size int64) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	flags := unix.MAP_PRIVATE
	if sealed(fd) {
		flags = unix.MAP_SHARED
	}
	b, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, flags|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map the snapshot (%d bytes): %w", size, err)
	}
	return b, nil
}

func unmap(b []byte) {
	if b != nil {
		_ = unix.Munmap(b)
	}
}

// seal makes fd immutable: no writes (which needs every writable mapping
// gone), no resizing, no further seals. It fails on a file that is not a
// sealable memfd.
func seal(fd int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	if err != nil {
		return fmt.Errorf("seal the snapshot's memfd (is it a memfd created with MFD_ALLOW_SEALING, with no writable mapping left?): %w", err)
	}
	return nil
}

// sealed reports whether fd carries the seals seal adds.
func sealed(fd int) bool {
	s, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	want := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW
	return err == nil && s&want == want
}

// fileSize returns fd's size.
func fileSize(fd int) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Size, nil
}

func closeFd(fd int) {
	if fd >= 0 {
		_ = unix.Close(fd)
	}
}

func dupFd(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// peerPid is the connected process as the kernel recorded it; 0 if unknown.
func peerPid(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var pid int
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// TotalMemory is the node's memory in bytes; 0 if unknown.
func TotalMemory() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}
