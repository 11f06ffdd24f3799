package cudadrv

import (
	"errors"
	"unsafe"
)

// Page-locked host memory the program already holds: a snapshot's memfd
// mapping, registered, is what the device copies into and out of at the
// link's rate (a pageable buffer goes through the driver's staging copy).

var hostCalls = callSet{open: cHostOpen}

// HostRegister page-locks b for the device copies of every context
// (cuMemHostRegister, CU_MEMHOSTREGISTER_PORTABLE; with readOnly, for a
// mapping without write access such as a restored snapshot's,
// CU_MEMHOSTREGISTER_READ_ONLY: the device only reads it). b must stay
// mapped until HostUnregister.
func HostRegister(b []byte, readOnly bool) error {
	if len(b) == 0 {
		return errors.New("cudadrv: HostRegister of an empty buffer")
	}
	if err := hostCalls.ensure(); err != nil {
		return err
	}
	flags := uint32(0x01) // CU_MEMHOSTREGISTER_PORTABLE
	if readOnly {
		flags |= 0x08 // CU_MEMHOSTREGISTER_READ_ONLY
	}
	return check("cuMemHostRegister", cMemHostRegister(unsafe.Pointer(&b[0]), len(b), flags))
}

// HostUnregister undoes HostRegister (cuMemHostUnregister).
func HostUnregister(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := hostCalls.ensure(); err != nil {
		return err
	}
	return check("cuMemHostUnregister", cMemHostUnregister(unsafe.Pointer(&b[0])))
}
