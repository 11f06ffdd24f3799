package memsnap

import (
	"hash/crc32"
	"runtime"
	"sync"
)

// A snapshot's checksum is one CRC over all of it, but a single core checks
// a 12 GB state in seconds, longer than the rest of a restore. So large
// buffers are checked in chunks on several cores and the chunks' CRCs
// combined into the CRC of the whole: the same value a single pass (or
// Python's zlib.crc32) gives. hash/crc32 has no combine, and no library
// made for it is worth a dependency for these few lines of GF(2) algebra.

// Reflected generator polynomials of the two checksums.
const (
	polyCastagnoli = 0x82f63b78
	polyIEEE       = 0xedb88320
)

// parallelFrom is the size from which a buffer is checked on several cores:
// below it, one pass is faster than starting goroutines.
const parallelFrom = 32 << 20

// minChunk bounds a chunk from below, so a chunk's CRC runs long enough to
// pay for its goroutine.
const minChunk = 8 << 20

// crcOf is b's CRC with tab (of poly), on up to GOMAXPROCS cores for a
// large b.
func crcOf(b []byte, tab *crc32.Table, poly uint32) uint32 {
	type part struct {
		crc uint32
		n   int
	}
	var parts []part
	inChunks(len(b), func(chunks int) { parts = make([]part, chunks) }, func(i, lo, hi int) {
		parts[i] = part{crc32.Checksum(b[lo:hi], tab), hi - lo}
	})
	if parts == nil {
		return crc32.Checksum(b, tab)
	}
	crc := parts[0].crc
	for _, p := range parts[1:] {
		crc = crcCombine(crc, p.crc, int64(p.n), poly)
	}
	return crc
}

// inChunks splits n bytes into one chunk per core when n is large enough
// to be worth it: it calls start with the number of chunks, then do for
// each chunk [lo, hi) on a goroutine of its own, and waits. For a small n
// it calls neither (the caller does the work in one pass).
func inChunks(n int, start func(chunks int), do func(i, lo, hi int)) {
	workers := min(runtime.GOMAXPROCS(0), n/minChunk)
	if n < parallelFrom || workers < 2 {
		return
	}
	start(workers)
	chunk := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for i := range workers {
		lo, hi := i*chunk, min((i+1)*chunk, n)
		wg.Go(func() { do(i, lo, hi) })
	}
	wg.Wait()
}

// crcCombine is the CRC of A followed by B, given crcA, crcB and B's length
// in bytes. A CRC is linear: appending n bytes multiplies A's register by
// x^(8n) modulo the polynomial, and the pre- and post-inversion of the two
// parts cancel, so crc(A‖B) = crcA·x^(8n) ⊕ crcB.
func crcCombine(crcA, crcB uint32, lenB int64, poly uint32) uint32 {
	if lenB <= 0 {
		return crcA
	}
	return mulModP(xPow8n(lenB, poly), crcA, poly) ^ crcB
}

// Polynomials over GF(2) modulo the CRC's, in the reflected order the
// tables use: bit 31 is x^0, bit 0 is x^31.
const xPow0 = uint32(1) << 31

// mulModP is a·b modulo poly.
func mulModP(a, b, poly uint32) uint32 {
	var p uint32
	for m := xPow0; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		// b·x: a shift towards higher powers, reduced by poly.
		if b&1 != 0 {
			b = b>>1 ^ poly
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow8n is x^(8n) modulo poly, by squaring.
func xPow8n(n int64, poly uint32) uint32 {
	result, base := xPow0, xPow0>>8 // x^0, x^8
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			result = mulModP(result, base, poly)
		}
		base = mulModP(base, base, poly)
	}
	return result
}

// Copy copies src into dst (as the builtin copy, returning the bytes
// copied), on several cores for a large src: one core copies a
// multi-gigabyte state at well below the memory's bandwidth.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	parallel := false
	inChunks(n, func(int) { parallel = true }, func(_, lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
	if !parallel {
		return copy(dst, src)
	}
	return n
}
