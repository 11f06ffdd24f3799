//go:build cgo

package nccl

// The only file with cgo calls. Each function below is one cgo call into
// shim.c, which calls NCCL through a dlsym'd function pointer. Arguments are
// integers and uintptrs (device memory, communicator and stream handles are
// never Go pointers), so a call costs a plain cgo transition and no allocation.

/*
#cgo LDFLAGS: -ldl
#include "shim.h"
*/
import "C"

import (
	"sync/atomic"
	"unsafe"
)

const cgoEnabled = true

const missingSymbol = C.GTN_MISSING

// cOpen dlopens path and resolves NCCL's entry points. It returns "" on success.
func cOpen(path string) string {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [1024]C.char
	if C.gtn_open(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return C.GoString(&buf[0])
	}
	return ""
}

// cClose unloads a library that cOpen opened but Load rejected.
func cClose() { C.gtn_close() }

func cOptionalName(i int) string {
	p := C.gtn_optional_name(C.int(i))
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

func cOptionalPresent(i int) bool { return C.gtn_optional_present(C.int(i)) != 0 }

func cGetVersion() (int, Result) {
	var v C.int
	r := C.gtn_get_version(&v)
	return int(v), Result(r)
}

func cErrorString(r Result) string { return C.GoString(C.gtn_error_string(C.int(r))) }

func cLastError(comm uintptr) string {
	p := C.gtn_last_error(C.uintptr_t(comm))
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

func cGetUniqueID(id *UniqueID) Result {
	return Result(C.gtn_get_unique_id((*C.gtn_uid)(unsafe.Pointer(id))))
}

// slot is C memory that receives a new ncclComm_t. NCCL may fill it after the
// init or split call returns (non-blocking communicators), so it must not be
// Go memory and lives until the communicator is gone.
type slot struct{ p *C.uintptr_t }

func newSlot() slot {
	return slot{(*C.uintptr_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.uintptr_t(0)))))}
}

func (s slot) load() uintptr {
	if s.p == nil {
		return 0
	}
	return atomic.LoadUintptr((*uintptr)(unsafe.Pointer(s.p)))
}

func (s slot) free() {
	if s.p != nil {
		C.free(unsafe.Pointer(s.p))
	}
}

func cInitRank(s slot, nranks int, id *UniqueID, rank int) Result {
	return Result(C.gtn_comm_init_rank(s.p, C.int(nranks), (*C.gtn_uid)(unsafe.Pointer(id)), C.int(rank)))
}

func cInitRankConfig(s slot, nranks int, id *UniqueID, rank int, cfg *cConfig) Result {
	return Result(C.gtn_comm_init_rank_config(s.p, C.int(nranks), (*C.gtn_uid)(unsafe.Pointer(id)), C.int(rank), cfg.ptr()))
}

func cInitRankScalable(s slot, nranks, rank int, ids []UniqueID, cfg *cConfig) Result {
	return Result(C.gtn_comm_init_rank_scalable(s.p, C.int(nranks), C.int(rank), C.int(len(ids)), (*C.gtn_uid)(unsafe.Pointer(unsafe.SliceData(ids))), cfg.ptr()))
}

func cSplit(comm uintptr, color, key int, s slot, cfg *cConfig) Result {
	return Result(C.gtn_comm_split(C.uintptr_t(comm), C.int(color), C.int(key), s.p, cfg.ptr()))
}

func cShrink(comm uintptr, exclude []int, s slot, cfg *cConfig, flags int) Result {
	n := len(exclude)
	list := (*C.int)(C.calloc(C.size_t(max(n, 1)), C.size_t(unsafe.Sizeof(C.int(0)))))
	defer C.free(unsafe.Pointer(list))
	for i, r := range exclude {
		unsafe.Slice(list, n)[i] = C.int(r)
	}
	return Result(C.gtn_comm_shrink(C.uintptr_t(comm), list, C.int(n), s.p, cfg.ptr(), C.int(flags)))
}

func cRevoke(comm uintptr, flags int) Result {
	return Result(C.gtn_comm_revoke(C.uintptr_t(comm), C.int(flags)))
}

func cCommGetUniqueID(comm uintptr, id *UniqueID) Result {
	return Result(C.gtn_comm_get_unique_id(C.uintptr_t(comm), (*C.gtn_uid)(unsafe.Pointer(id))))
}

// cGrow passes id as NULL when it is nil (an existing rank other than the root).
func cGrow(comm uintptr, nranks int, id *UniqueID, rank int, s slot, cfg *cConfig) Result {
	return Result(C.gtn_comm_grow(C.uintptr_t(comm), C.int(nranks), (*C.gtn_uid)(unsafe.Pointer(id)), C.int(rank), s.p, cfg.ptr()))
}

func cFinalize(comm uintptr) Result { return Result(C.gtn_comm_finalize(C.uintptr_t(comm))) }
func cDestroy(comm uintptr) Result  { return Result(C.gtn_comm_destroy(C.uintptr_t(comm))) }
func cAbort(comm uintptr) Result    { return Result(C.gtn_comm_abort(C.uintptr_t(comm))) }

func cAsyncError(comm uintptr) (state, r Result) {
	var s C.int
	r = Result(C.gtn_comm_get_async_error(C.uintptr_t(comm), &s))
	return Result(s), r
}

func cCount(comm uintptr) (int, Result) {
	var n C.int
	r := C.gtn_comm_count(C.uintptr_t(comm), &n)
	return int(n), Result(r)
}

func cCuDevice(comm uintptr) (int, Result) {
	var n C.int
	r := C.gtn_comm_cu_device(C.uintptr_t(comm), &n)
	return int(n), Result(r)
}

func cUserRank(comm uintptr) (int, Result) {
	var n C.int
	r := C.gtn_comm_user_rank(C.uintptr_t(comm), &n)
	return int(n), Result(r)
}

func cAllReduce(send, recv uintptr, count int, dt DataType, op RedOp, comm, stream uintptr) Result {
	return Result(C.gtn_all_reduce(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dt), C.int(op), C.uintptr_t(comm), C.uintptr_t(stream)))
}

func cBroadcast(send, recv uintptr, count int, dt DataType, root int, comm, stream uintptr) Result {
	return Result(C.gtn_broadcast(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dt), C.int(root), C.uintptr_t(comm), C.uintptr_t(stream)))
}

func cReduce(send, recv uintptr, count int, dt DataType, op RedOp, root int, comm, stream uintptr) Result {
	return Result(C.gtn_reduce(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dt), C.int(op), C.int(root), C.uintptr_t(comm), C.uintptr_t(stream)))
}

func cAllGather(send, recv uintptr, sendCount int, dt DataType, comm, stream uintptr) Result {
	return Result(C.gtn_all_gather(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(sendCount), C.int(dt), C.uintptr_t(comm), C.uintptr_t(stream)))
}

func cReduceScatter(send, recv uintptr, recvCount int, dt DataType, op RedOp, comm, stream uintptr) Result {
	return Result(C.gtn_reduce_scatter(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(recvCount), C.int(dt), C.int(op), C.uintptr_t(comm), C.uintptr_t(stream)))
}

func cSend(buf uintptr, count int, dt DataType, peer int, comm, stream uintptr) Result {
	return Result(C.gtn_send(C.uintptr_t(buf), C.size_t(count), C.int(dt), C.int(peer), C.uintptr_t(comm), C.uintptr_t(stream)))
}

func cRecv(buf uintptr, count int, dt DataType, peer int, comm, stream uintptr) Result {
	return Result(C.gtn_recv(C.uintptr_t(buf), C.size_t(count), C.int(dt), C.int(peer), C.uintptr_t(comm), C.uintptr_t(stream)))
}

func cMemAlloc(bytes int) (uintptr, Result) {
	var p C.uintptr_t
	r := C.gtn_mem_alloc(&p, C.size_t(bytes))
	return uintptr(p), Result(r)
}

func cMemFree(p uintptr) Result { return Result(C.gtn_mem_free(C.uintptr_t(p))) }

func cWindowRegister(comm, buf uintptr, bytes int, flags int) (uintptr, Result) {
	var w C.uintptr_t
	r := C.gtn_comm_window_register(C.uintptr_t(comm), C.uintptr_t(buf), C.size_t(bytes), &w, C.int(flags))
	return uintptr(w), Result(r)
}

func cWindowDeregister(comm, win uintptr) Result {
	return Result(C.gtn_comm_window_deregister(C.uintptr_t(comm), C.uintptr_t(win)))
}

func cGroupStart() Result { return Result(C.gtn_group_start()) }
func cGroupEnd() Result   { return Result(C.gtn_group_end()) }

// cConfig is the C ncclConfig_t a Config becomes, in C memory (NCCL may
// keep pointers into it, which cgo allows only for C memory), with the C
// strings it owns.
type cConfig struct {
	c       *C.gtn_config
	strings []*C.char
}

// ptr returns the C struct, or NULL for a nil cConfig (inherit, for Split).
func (c *cConfig) ptr() *C.gtn_config {
	if c == nil {
		return nil
	}
	return c.c
}

// free releases the C memory. NCCL may keep pointers to the strings for the
// communicator's life, so a Comm calls it only when it is destroyed.
func (c *cConfig) free() {
	if c == nil || c.c == nil {
		return
	}
	for _, s := range c.strings {
		C.free(unsafe.Pointer(s))
	}
	C.free(unsafe.Pointer(c.c))
	c.c, c.strings = nil, nil
}

func newCConfig(f configFields) *cConfig {
	cc := &cConfig{c: (*C.gtn_config)(C.calloc(1, C.size_t(unsafe.Sizeof(C.gtn_config{}))))}
	cc.c.size = C.size_t(unsafe.Sizeof(*cc.c))
	cc.c.magic = C.GTN_CONFIG_MAGIC
	cc.c.version = C.GTN_CONFIG_VERSION
	cc.c.blocking = C.int(f.blocking)
	cc.c.cgaClusterSize = C.int(f.cgaClusterSize)
	cc.c.minCTAs = C.int(f.minCTAs)
	cc.c.maxCTAs = C.int(f.maxCTAs)
	cc.c.splitShare = C.int(f.splitShare)
	cc.c.trafficClass = C.int(f.trafficClass)
	cc.c.collnetEnable = C.int(f.collnetEnable)
	cc.c.CTAPolicy = C.int(f.ctaPolicy)
	cc.c.shrinkShare = C.int(f.shrinkShare)
	cc.c.nvlsCTAs = C.int(f.nvlsCTAs)
	cc.c.nChannelsPerNetPeer = C.int(f.nChannelsPerNetPeer)
	cc.c.nvlinkCentricSched = C.int(f.nvlinkCentricSched)
	if f.netName != "" {
		cc.c.netName = C.CString(f.netName)
		cc.strings = append(cc.strings, cc.c.netName)
	}
	if f.commName != "" {
		cc.c.commName = C.CString(f.commName)
		cc.strings = append(cc.strings, cc.c.commName)
	}
	return cc
}

// layout reports the C struct as NCCL will read it, for tests.
func (c *cConfig) layout() configLayout {
	var z C.gtn_config
	return configLayout{
		size:        int(c.c.size),
		sizeofC:     int(unsafe.Sizeof(z)),
		magic:       uint32(c.c.magic),
		version:     int(c.c.version),
		offNetName:  int(unsafe.Offsetof(z.netName)),
		offCommName: int(unsafe.Offsetof(z.commName)),
		offLast:     int(unsafe.Offsetof(z.nvlinkCentricSched)),
		fields: configFields{
			blocking: int32(c.c.blocking), cgaClusterSize: int32(c.c.cgaClusterSize),
			minCTAs: int32(c.c.minCTAs), maxCTAs: int32(c.c.maxCTAs), netName: goStringOrEmpty(c.c.netName),
			splitShare: int32(c.c.splitShare), trafficClass: int32(c.c.trafficClass), commName: goStringOrEmpty(c.c.commName),
			collnetEnable: int32(c.c.collnetEnable), ctaPolicy: int32(c.c.CTAPolicy), shrinkShare: int32(c.c.shrinkShare),
			nvlsCTAs: int32(c.c.nvlsCTAs), nChannelsPerNetPeer: int32(c.c.nChannelsPerNetPeer), nvlinkCentricSched: int32(c.c.nvlinkCentricSched),
		},
	}
}

func goStringOrEmpty(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}
