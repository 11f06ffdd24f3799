package memsnap

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// The combined CRC of any split is the CRC of the whole, for both
// checksums, and the parallel path gives what one pass gives.
func TestCRCCombine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 1<<16)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	for _, c := range []struct {
		name string
		tab  *crc32.Table
		poly uint32
	}{{"castagnoli", castagnoli, polyCastagnoli}, {"ieee", ieee, polyIEEE}} {
		for _, cut := range []int{0, 1, 7, 8, 1000, 4096, len(b) - 1, len(b)} {
			whole := crc32.Checksum(b, c.tab)
			got := crcCombine(crc32.Checksum(b[:cut], c.tab), crc32.Checksum(b[cut:], c.tab), int64(len(b)-cut), c.poly)
			if got != whole {
				t.Errorf("%s, cut at %d: combined %08x, whole %08x", c.name, cut, got, whole)
			}
		}
	}
}

func TestParallelChecksumIsTheSinglePass(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 100 MB")
	}
	b := make([]byte, parallelFrom*3+12345) // an uneven last chunk
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < len(b); i += 8 {
		b[i] = byte(r.Uint32())
	}
	if got, want := Checksum(b), crc32.Checksum(b, castagnoli); got != want {
		t.Errorf("CRC-32C: parallel %08x, single pass %08x", got, want)
	}
	if got, _ := checksumBy(SumIEEE, b); got != crc32.ChecksumIEEE(b) {
		t.Errorf("CRC-32: parallel %08x, single pass %08x", got, crc32.ChecksumIEEE(b))
	}
}

func BenchmarkChecksum(b *testing.B) {
	buf := make([]byte, 256<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		Checksum(buf)
	}
}

func TestParallelCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 200 MB")
	}
	src := make([]byte, parallelFrom*3+777)
	for i := range src {
		src[i] = byte(i * 7)
	}
	dst := make([]byte, len(src)+5)
	if n := Copy(dst, src); n != len(src) {
		t.Fatalf("copied %d bytes, want %d", n, len(src))
	}
	for i := range src {
		if dst[i] != src[i] {
			t.Fatalf("byte %d: %d, want %d", i, dst[i], src[i])
		}
	}
	if dst[len(src)] != 0 {
		t.Fatal("wrote past src's length")
	}
}
