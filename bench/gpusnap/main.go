// Command gpusnap measures the in-memory snapshot tier (issue 29) with
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
	"github.com/gotrain/gotrain/internal/cudadrv"
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
	n := int(size)
	state, err := cudadrv.MemAlloc(n)
	if err != nil {
		return err
	}
	back, err := cudadrv.MemAlloc(n)
	if err != nil {
		return err
	}
	// A state that is not all one byte: a word pattern.
	if err := cudadrv.MemsetD32(state, 0x9e3779b9, n/4); err != nil {
		return err
	}
	if err := cudadrv.MemsetD8(state+cudadrv.DevicePtr(n/3), 0x5a, n/7); err != nil {
		return err
	}

	c, stopAgent, err := snapagent.Start()
	if err != nil {
		return err
	}
	defer stopAgent()

	buf, err := memsnap.NewBuffer(size) // the snapshot buffer, reused (worker.Snapshots)
	if err != nil {
		return err
	}
	clear(buf.Bytes()) // its pages exist before any copy is timed
	pageable := make([]byte, n)
	clear(pageable)
	check := make([]byte, n)
	clear(check)

	// Pageable first, then the same buffer page-locked.
	var d2hPageable, h2dPageable []time.Duration
	for range reps {
		t, err := timed(func() error { return cudadrv.CopyFromDevice(buf.Bytes(), state) })
		if err != nil {
			return err
		}
		d2hPageable = append(d2hPageable, t)
		t, err = timed(func() error { return cudadrv.CopyToDevice(back, buf.Bytes()) })
		if err != nil {
			return err
		}
		h2dPageable = append(h2dPageable, t)
	}
	register, err := timed(func() error { return cudadrv.HostRegister(buf.Bytes(), false) })
	if err != nil {
		return err
	}
	var d2h, hand, latest, regRestore, h2d, h2dUnreg, unregRestore []time.Duration
	for i := range reps {
		t, err := timed(func() error { return cudadrv.CopyFromDevice(buf.Bytes(), state) })
		if err != nil {
			return err
		}
		d2h = append(d2h, t)
		step := int64(i + 1)
		t, err = timed(func() error { return c.CommitReused(buf, step) })
		if err != nil {
			return err
		}
		hand = append(hand, t)
		var r *memsnap.Restored
		t, err = timed(func() error { r, err = c.Latest(); return err })
		if err != nil {
			return err
		}
		latest = append(latest, t)
		if r.Step != step {
			return fmt.Errorf("restored step %d, want %d", r.Step, step)
		}
		// The restore path: the agent's mapping, page-locked read-only,
		// then copied to the device.
		t, err = timed(func() error { return cudadrv.HostRegister(r.Bytes(), true) })
		if err != nil {
			return err
		}
		regRestore = append(regRestore, t)
		if err := cudadrv.MemsetD8(back, 0, n); err != nil {
			return err
		}
		t, err = timed(func() error { return cudadrv.CopyToDevice(back, r.Bytes()) })
		if err != nil {
			return err
		}
		h2d = append(h2d, t)
		t, err = timed(func() error { return cudadrv.HostUnregister(r.Bytes()) })
		if err != nil {
			return err
		}
		unregRestore = append(unregRestore, t)
		if err := cudadrv.CopyFromDevice(check, back); err != nil {
			return err
		}
		if err := cudadrv.CopyFromDevice(pageable, state); err != nil {
			return err
		}
		if !bytes.Equal(check, pageable) {
			return errors.New("the state restored to the device differs from the one snapshotted")
		}
		// The same mapping not page-locked: what a restore without the
		// registration costs.
		t, err = timed(func() error { return cudadrv.CopyToDevice(back, r.Bytes()) })
		if err != nil {
			return err
		}
		h2dUnreg = append(h2dUnreg, t)
		r.Close()
	}
	_ = cudadrv.HostUnregister(buf.Bytes())

	// A restarted rank: the process that wrote the snapshot is gone (its
	// buffer unmapped), so the agent seals it and checks it once, at the
	// first restore. End to end, own memory → device: ask for it, page-lock
	// the mapping read-only, copy, unlock; then the same without the
	// page-lock.
	buf.Discard()
	restart := func() (latest, register, copyIn, unregister time.Duration, err error) {
		if err = cudadrv.MemsetD8(back, 0, n); err != nil {
			return
		}
		var r *memsnap.Restored
		if latest, err = timed(func() error { r, err = c.Latest(); return err }); err != nil {
			return
		}
		defer r.Close()
		if register, err = timed(func() error { return cudadrv.HostRegister(r.Bytes(), true) }); err != nil {
			return
		}
		if copyIn, err = timed(func() error { return cudadrv.CopyToDevice(back, r.Bytes()) }); err != nil {
			return
		}
		unregister, err = timed(func() error { return cudadrv.HostUnregister(r.Bytes()) })
		return
	}
	var e2e, e2eLatest, e2eReg, e2eCopy, e2eUnreg []time.Duration
	var firstE2E, firstLatest time.Duration
	for i := range reps + 1 {
		l, rg, cp, ur, err := restart()
		if err != nil {
			return fmt.Errorf("restore after the writer is gone: %w", err)
		}
		if err := cudadrv.CopyFromDevice(check, back); err != nil {
			return err
		}
		if !bytes.Equal(check, pageable) {
			return errors.New("the state restored to the device after its writer was gone differs from the one snapshotted")
		}
		if i == 0 {
			firstE2E, firstLatest = l+rg+cp+ur, l
			continue
		}
		e2e, e2eLatest, e2eReg, e2eCopy, e2eUnreg = append(e2e, l+rg+cp+ur), append(e2eLatest, l), append(e2eReg, rg), append(e2eCopy, cp), append(e2eUnreg, ur)
	}
	var e2ePageable []time.Duration
	for range reps {
		t, err := timed(func() error {
			r, err := c.Latest()
			if err != nil {
				return err
			}
			defer r.Close()
			return cudadrv.CopyToDevice(back, r.Bytes())
		})
		if err != nil {
			return err
		}
		e2ePageable = append(e2ePageable, t)
	}

	gbps := func(d time.Duration) string { return fmt.Sprintf("%.1f GB/s", float64(size)/d.Seconds()/1e9) }
	row := func(what string, ds []time.Duration) {
		fmt.Printf("  %-58s %10v  %s\n", what, med(ds).Round(time.Microsecond), gbps(med(ds)))
	}
	fmt.Printf("gpusnap: %s, state %d bytes (%.2f GiB), %d reps, medians\n", name, size, float64(size)/(1<<30), reps)
	row("snapshot device→memfd, pageable", d2hPageable)
	row("snapshot device→memfd, page-locked", d2h)
	row("restore memfd→device, pageable", h2dPageable)
	row("restore agent's mapping→device, page-locked", h2d)
	row("restore agent's mapping→device, not page-locked", h2dUnreg)
	fmt.Printf("  %-58s %10v  (once per buffer)\n", "page-lock the snapshot buffer (cuMemHostRegister)", register.Round(time.Microsecond))
	fmt.Printf("  %-58s %10v\n", "hand-over to the agent (CRC-32C + seal check)", med(hand).Round(time.Microsecond))
	fmt.Printf("  %-58s %10v\n", "ask the agent for it back (map + CRC-32C)", med(latest).Round(time.Microsecond))
	fmt.Printf("  %-58s %10v / %v\n", "page-lock / unlock the agent's mapping (per restore)", med(regRestore).Round(time.Microsecond), med(unregRestore).Round(time.Microsecond))
	fmt.Println("  restarted rank (the writer gone), own memory → device, end to end:")
	fmt.Printf("  %-58s %10v  %s (of it: ask the agent %v)\n", "first restore (the agent seals and checks once)", firstE2E.Round(time.Microsecond), gbps(firstE2E), firstLatest.Round(time.Microsecond))
	row("later restores, page-locked (ask + lock + copy + unlock)", e2e)
	fmt.Printf("  %-58s %v / %v / %v / %v\n", "  of it: ask / lock / copy / unlock", med(e2eLatest).Round(time.Microsecond), med(e2eReg).Round(time.Microsecond), med(e2eCopy).Round(time.Microsecond), med(e2eUnreg).Round(time.Microsecond))
	row("later restores, pageable (ask + copy)", e2ePageable)
	fmt.Println("  every restore compared byte for byte with the device state: equal")
	return nil
}

func med(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
