package cpucomm

import (
	"fmt"
	"testing"

	"github.com/gotrain/gotrain/worker/comm"
)

// BenchmarkAlgorithms compares the direct and the ring all-reduce around
// directMaxBytes, and the ring's chunk sizes, to choose those constants:
//
//	go test -run '^$' -bench Algorithms ./worker/cpucomm/
func BenchmarkAlgorithms(b *testing.B) {
	for _, ranks := range []int{2, 4} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			comms := newMesh(b, ranks)
			for _, size := range []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 16 << 20} {
				for _, tu := range []tuning{
					{"direct", 1 << 30, chunkBytes},
					{"ring-128K", 0, 128 << 10},
					{"ring-512K", 0, 512 << 10},
					{"ring-2M", 0, 2 << 20},
				} {
					if tu.name == "direct" && size > 1<<20 {
						continue
					}
					b.Run(fmt.Sprintf("size=%dK/%s", size>>10, tu.name), func(b *testing.B) {
						tu.apply(comms)
						bufs := make([][]float32, ranks)
						for r := range bufs {
							bufs[r] = make([]float32, size/4)
						}
						b.SetBytes(int64(size))
						b.ResetTimer()
						errs := onAll(comms, func(r int, c *Comm) error {
							for range b.N {
								if err := c.AllReduce(b.Context(), comm.Host(bufs[r]), comm.Host(bufs[r]), comm.Sum); err != nil {
									return err
								}
							}
							return nil
						})
						for _, err := range errs {
							if err != nil {
								b.Fatal(err)
							}
						}
					})
				}
			}
		})
	}
}
