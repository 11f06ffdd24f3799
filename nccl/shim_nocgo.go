//go:build !cgo

package nccl

// Without cgo there is no way to call NCCL: Load reports that, and nothing
// below it is reachable because no Library or Comm can exist.

const cgoEnabled = false

const missingSymbol = -1

func cOpen(string) string {
	return "this binary was built without cgo (CGO_ENABLED=0); rebuild it with cgo enabled and a C compiler to use NCCL"
}

func unreachable() { panic("nccl: called without a loaded library (built without cgo)") }

func cClose()                              {}
func cOptionalName(int) string             { unreachable(); return "" }
func cOptionalPresent(int) bool            { unreachable(); return false }
func cGetVersion() (int, Result)           { unreachable(); return 0, 0 }
func cErrorString(Result) string           { unreachable(); return "" }
func cLastError(uintptr) string            { unreachable(); return "" }
func cGetUniqueID(*UniqueID) Result        { unreachable(); return 0 }
func cFinalize(uintptr) Result             { unreachable(); return 0 }
func cDestroy(uintptr) Result              { unreachable(); return 0 }
func cAbort(uintptr) Result                { unreachable(); return 0 }
func cAsyncError(uintptr) (Result, Result) { unreachable(); return 0, 0 }
func cCount(uintptr) (int, Result)         { unreachable(); return 0, 0 }
func cCuDevice(uintptr) (int, Result)      { unreachable(); return 0, 0 }
func cUserRank(uintptr) (int, Result)      { unreachable(); return 0, 0 }
func cAllReduce(uintptr, uintptr, int, DataType, RedOp, uintptr, uintptr) Result {
	unreachable()
	return 0
}
func cBroadcast(uintptr, uintptr, int, DataType, int, uintptr, uintptr) Result {
	unreachable()
	return 0
}
func cReduce(uintptr, uintptr, int, DataType, RedOp, int, uintptr, uintptr) Result {
	unreachable()
	return 0
}
func cAllGather(uintptr, uintptr, int, DataType, uintptr, uintptr) Result { unreachable(); return 0 }
func cReduceScatter(uintptr, uintptr, int, DataType, RedOp, uintptr, uintptr) Result {
	unreachable()
	return 0
}
func cSend(uintptr, int, DataType, int, uintptr, uintptr) Result { unreachable(); return 0 }
func cRecv(uintptr, int, DataType, int, uintptr, uintptr) Result { unreachable(); return 0 }
func cGroupStart() Result                                        { unreachable(); return 0 }
func cGroupEnd() Result                                          { unreachable(); return 0 }

type cConfig struct{ f configFields }

func newCConfig(f configFields) *cConfig { return &cConfig{f: f} }
func (c *cConfig) free()                 {}

func (c *cConfig) layout() configLayout {
	return configLayout{size: 80, sizeofC: 80, magic: 0xcafebeef, version: 22800, offNetName: 32, offCommName: 48, offLast: 76, fields: c.f}
}

type slot struct{}

func newSlot() slot        { return slot{} }
func (slot) load() uintptr { return 0 }
func (slot) free()         {}

func cInitRank(slot, int, *UniqueID, int) Result                    { unreachable(); return 0 }
func cInitRankConfig(slot, int, *UniqueID, int, *cConfig) Result    { unreachable(); return 0 }
func cInitRankScalable(slot, int, int, []UniqueID, *cConfig) Result { unreachable(); return 0 }
func cSplit(uintptr, int, int, slot, *cConfig) Result               { unreachable(); return 0 }
func cShrink(uintptr, []int, slot, *cConfig, int) Result            { unreachable(); return 0 }
func cRevoke(uintptr, int) Result                                   { unreachable(); return 0 }
func cCommGetUniqueID(uintptr, *UniqueID) Result                    { unreachable(); return 0 }
func cGrow(uintptr, int, *UniqueID, int, slot, *cConfig) Result     { unreachable(); return 0 }

func cMemAlloc(int) (uintptr, Result)                              { unreachable(); return 0, 0 }
func cMemFree(uintptr) Result                                      { unreachable(); return 0 }
func cWindowRegister(uintptr, uintptr, int, int) (uintptr, Result) { unreachable(); return 0, 0 }
func cWindowDeregister(uintptr, uintptr) Result                    { unreachable(); return 0 }
