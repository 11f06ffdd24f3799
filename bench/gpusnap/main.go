// Command gpusnap measures the in-memory snapshot tier with
// the state on the GPU: a snapshot is a device-to-host copy into the
// memfd buffer the agent is handed (internal/memsnap), a restore a
// host-to-device copy out of the agent's mapping. Side by side in one run,
// for one state size: into and out of that memfd page-locked
// (cudadrv.HostRegister, once per buffer) and pageable (the driver stages
// the copy), and the hand-over to an agent in another process and back.
// Every restore is checked: the state that comes back to the device is
// copied out again and compared byte for byte.
//
//	go build -o bin/gpusnap ./bench/gpusnap
//	bin/gpusnap -bytes 1073741824 -reps 5
//	bin/gpusnap -bytes 12884901888 -reps 3   # torchft's published 12 GB case
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/gotrain/gotrain/bench/internal/snapagent"
	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/memsnap"
)

func main() {
	agent := flag.String("agent", "", "internal: serve the snapshot socket at this path")
	size := flag.Int64("bytes", 1<<30, "state size in bytes")
	reps := flag.Int("reps", 3, "repetitions (the median is printed)")
	flag.Parse()
	if *agent != "" {
		snapagent.Serve(*agent)
		return
	}
	if err := run(*size, *reps); err != nil {
		fmt.Fprintln(os.Stderr, "gpusnap:", err)
		os.Exit(1)
	}
}

// timed runs f and returns how long it took.
func timed(f func() error) (time.Duration, error) {
	t := time.Now()
	err := f()
	return time.Since(t), err
}

func run(size int64, reps int) error {
	runtime.LockOSThread() // the context is this thread's
	d, err := cudadrv.Load()
	if err != nil {
		return err
	}
	dev, err := d.Device(0)
	if err != nil {
		return err
	}
	name, _ := dev.Name()
	ctx, err := dev.RetainPrimaryContext()
	if err != nil {
		return err
	}
	defer func() { _ = dev.ReleasePrimaryContext() }()
	if err := ctx.SetCurrent(); err != nil {
		return err
	}
	b := &snapBench{n: int(size)}
	if err := b.allocState(); err != nil {
		return err
	}

	c, stopAgent, err := snapagent.Start()
	if err != nil {
		return err
	}
	defer stopAgent()
	b.c = c

	if b.buf, err = memsnap.NewBuffer(size); err != nil { // the snapshot buffer, reused (worker.Snapshots)
		return err
	}
	clear(b.buf.Bytes()) // its pages exist before any copy is timed
	b.pageable = make([]byte, b.n)
	clear(b.pageable)
	b.check = make([]byte, b.n)
	clear(b.check)

	// Pageable first, then the same buffer page-locked.
	var t snapTimes
	for range reps {
		if err := b.pageableRound(&t); err != nil {
			return err
		}
	}
	if t.register, err = timed(func() error { return cudadrv.HostRegister(b.buf.Bytes(), false) }); err != nil {
		return err
	}
	for i := range reps {
		if err := b.lockedRound(&t, int64(i+1)); err != nil {
			return err
		}
	}
	_ = cudadrv.HostUnregister(b.buf.Bytes())
	// A restarted rank: the process that wrote the snapshot is gone (its
	// buffer unmapped), so the agent seals it and checks it once, at the
	// first restore.
	b.buf.Discard()
	for i := range reps + 1 {
		if err := b.restartedRound(&t, i == 0); err != nil {
			return fmt.Errorf("restore after the writer is gone: %w", err)
		}
	}
	t.print(name, size, reps)
	return nil
}

// restartedRound times a restarted rank's restore, own memory → device, end
// to end: ask for it, page-lock the mapping read-only, copy, unlock
// (checked byte for byte); then the same without the page-lock.
func (b *snapBench) restartedRound(ts *snapTimes, first bool) error {
	if err := cudadrv.MemsetD8(b.back, 0, b.n); err != nil {
		return err
	}
	var r *memsnap.Restored
	var err error
	ask, err := timed(func() error { r, err = b.c.Latest(); return err })
	if err != nil {
		return err
	}
	lock, err := timed(func() error { return cudadrv.HostRegister(r.Bytes(), true) })
	if err != nil {
		r.Close()
		return err
	}
	cp, err := timed(func() error { return cudadrv.CopyToDevice(b.back, r.Bytes()) })
	unlock, uerr := timed(func() error { return cudadrv.HostUnregister(r.Bytes()) })
	r.Close()
	if err = errors.Join(err, uerr); err != nil {
		return err
	}
	if err := cudadrv.CopyFromDevice(b.check, b.back); err != nil {
		return err
	}
	if !bytes.Equal(b.check, b.pageable) {
		return errors.New("the state restored to the device after its writer was gone differs from the one snapshotted")
	}
	if first {
		ts.firstRestart, ts.firstAsk = ask+lock+cp+unlock, ask
		return nil
	}
	ts.restart = append(ts.restart, ask+lock+cp+unlock)
	ts.restartAsk, ts.restartLock = append(ts.restartAsk, ask), append(ts.restartLock, lock)
	ts.restartCopy, ts.restartUnlock = append(ts.restartCopy, cp), append(ts.restartUnlock, unlock)
	t, err := timed(func() error {
		r, err := b.c.Latest()
		if err != nil {
			return err
		}
		defer r.Close()
		return cudadrv.CopyToDevice(b.back, r.Bytes())
	})
	ts.restartPageable = append(ts.restartPageable, t)
	return err
}

// snapBench is the state on the device, its copy back, the snapshot
// buffer and the agent.
type snapBench struct {
	n               int
	state, back     cudadrv.DevicePtr
	c               *memsnap.Client
	buf             *memsnap.Buffer
	pageable, check []byte
}

// snapTimes are the measurements, one per repetition.
type snapTimes struct {
	d2hPageable, h2dPageable                                   []time.Duration
	register                                                   time.Duration
	d2h, hand, latest, regRestore, h2d, h2dUnreg, unregRestore []time.Duration
	// A restarted rank's restores: the first (the agent seals and checks
	// once) and the later ones, with their parts, and without page-locking.
	firstRestart, firstAsk                                       time.Duration
	restart, restartAsk, restartLock, restartCopy, restartUnlock []time.Duration
	restartPageable                                              []time.Duration
}

// allocState allocates the state and its copy back on the device and fills
// the state with a pattern.
func (b *snapBench) allocState() (err error) {
	n := b.n
	if b.state, err = cudadrv.MemAlloc(n); err != nil {
		return err
	}
	if b.back, err = cudadrv.MemAlloc(n); err != nil {
		return err
	}
	// A state that is not all one byte: a word pattern.
	if err := cudadrv.MemsetD32(b.state, 0x9e3779b9, n/4); err != nil {
		return err
	}
	return cudadrv.MemsetD8(b.state+cudadrv.DevicePtr(n/3), 0x5a, n/7)
}

// pageableRound times a snapshot into and a restore out of the buffer
// before it is page-locked.
func (b *snapBench) pageableRound(ts *snapTimes) error {
	t, err := timed(func() error { return cudadrv.CopyFromDevice(b.buf.Bytes(), b.state) })
	if err != nil {
		return err
	}
	ts.d2hPageable = append(ts.d2hPageable, t)
	t, err = timed(func() error { return cudadrv.CopyToDevice(b.back, b.buf.Bytes()) })
	if err != nil {
		return err
	}
	ts.h2dPageable = append(ts.h2dPageable, t)
	return nil
}

// lockedRound times a snapshot of step into the page-locked buffer, its
// hand-over to the agent and back, and the restore to the device, which it
// checks.
func (b *snapBench) lockedRound(ts *snapTimes, step int64) error {
	t, err := timed(func() error { return cudadrv.CopyFromDevice(b.buf.Bytes(), b.state) })
	if err != nil {
		return err
	}
	ts.d2h = append(ts.d2h, t)
	t, err = timed(func() error { return b.c.CommitReused(b.buf, step) })
	if err != nil {
		return err
	}
	ts.hand = append(ts.hand, t)
	var r *memsnap.Restored
	t, err = timed(func() error { r, err = b.c.Latest(); return err })
	if err != nil {
		return err
	}
	ts.latest = append(ts.latest, t)
	if r.Step != step {
		return fmt.Errorf("restored step %d, want %d", r.Step, step)
	}
	if err := b.restore(ts, r); err != nil {
		return err
	}
	r.Close()
	return nil
}

// restore times the restore path: the agent's mapping, page-locked
// read-only, then copied to the device; checked byte for byte; then the
// same mapping not page-locked: what a restore without the registration
// costs.
func (b *snapBench) restore(ts *snapTimes, r *memsnap.Restored) error {
	t, err := timed(func() error { return cudadrv.HostRegister(r.Bytes(), true) })
	if err != nil {
		return err
	}
	ts.regRestore = append(ts.regRestore, t)
	if err := cudadrv.MemsetD8(b.back, 0, b.n); err != nil {
		return err
	}
	t, err = timed(func() error { return cudadrv.CopyToDevice(b.back, r.Bytes()) })
	if err != nil {
		return err
	}
	ts.h2d = append(ts.h2d, t)
	t, err = timed(func() error { return cudadrv.HostUnregister(r.Bytes()) })
	if err != nil {
		return err
	}
	ts.unregRestore = append(ts.unregRestore, t)
	if err := cudadrv.CopyFromDevice(b.check, b.back); err != nil {
		return err
	}
	if err := cudadrv.CopyFromDevice(b.pageable, b.state); err != nil {
		return err
	}
	if !bytes.Equal(b.check, b.pageable) {
		return errors.New("the state restored to the device differs from the one snapshotted")
	}
	t, err = timed(func() error { return cudadrv.CopyToDevice(b.back, r.Bytes()) })
	if err != nil {
		return err
	}
	ts.h2dUnreg = append(ts.h2dUnreg, t)
	return nil
}

// print prints the medians.
func (ts *snapTimes) print(name string, size int64, reps int) {
	gbps := func(d time.Duration) string { return fmt.Sprintf("%.1f GB/s", float64(size)/d.Seconds()/1e9) }
	row := func(what string, ds []time.Duration) {
		fmt.Printf("  %-58s %10v  %s\n", what, med(ds).Round(time.Microsecond), gbps(med(ds)))
	}
	fmt.Printf("gpusnap: %s, state %d bytes (%.2f GiB), %d reps, medians\n", name, size, float64(size)/(1<<30), reps)
	row("snapshot device→memfd, pageable", ts.d2hPageable)
	row("snapshot device→memfd, page-locked", ts.d2h)
	row("restore memfd→device, pageable", ts.h2dPageable)
	row("restore agent's mapping→device, page-locked", ts.h2d)
	row("restore agent's mapping→device, not page-locked", ts.h2dUnreg)
	fmt.Printf("  %-58s %10v  (once per buffer)\n", "page-lock the snapshot buffer (cuMemHostRegister)", ts.register.Round(time.Microsecond))
	fmt.Printf("  %-58s %10v\n", "hand-over to the agent (CRC-32C + seal check)", med(ts.hand).Round(time.Microsecond))
	fmt.Printf("  %-58s %10v\n", "ask the agent for it back (map + CRC-32C)", med(ts.latest).Round(time.Microsecond))
	fmt.Printf("  %-58s %10v / %v\n", "page-lock / unlock the agent's mapping (per restore)", med(ts.regRestore).Round(time.Microsecond), med(ts.unregRestore).Round(time.Microsecond))
	fmt.Println("  restarted rank (the writer gone), own memory → device, end to end:")
	fmt.Printf("  %-58s %10v  %s (of it: ask the agent %v)\n", "first restore (the agent seals and checks once)", ts.firstRestart.Round(time.Microsecond), gbps(ts.firstRestart), ts.firstAsk.Round(time.Microsecond))
	row("later restores, page-locked (ask + lock + copy + unlock)", ts.restart)
	fmt.Printf("  %-58s %v / %v / %v / %v\n", "  of it: ask / lock / copy / unlock", med(ts.restartAsk).Round(time.Microsecond), med(ts.restartLock).Round(time.Microsecond), med(ts.restartCopy).Round(time.Microsecond), med(ts.restartUnlock).Round(time.Microsecond))
	row("later restores, pageable (ask + copy)", ts.restartPageable)
	fmt.Println("  every restore compared byte for byte with the device state: equal")
}

func med(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
