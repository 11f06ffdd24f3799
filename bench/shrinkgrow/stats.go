package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"
)

// stats keeps every phase's time per cycle.
type stats struct {
	mu      sync.Mutex
	order   []string
	samples map[string][]sample
}

type sample struct {
	cycle int
	d     time.Duration
}

func newStats() *stats { return &stats{samples: map[string][]sample{}} }

func (s *stats) add(cycle int, phase string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.samples[phase]; !ok {
		s.order = append(s.order, phase)
	}
	s.samples[phase] = append(s.samples[phase], sample{cycle, d})
}

// quantile is the nearest-rank q-quantile of sorted ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds))*q+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

func (s *stats) print(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintln(w, "| phase | n | p50 ms | p99 ms | max ms | mean ms |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for _, p := range s.order {
		ds := make([]time.Duration, 0, len(s.samples[p]))
		var sum time.Duration
		for _, x := range s.samples[p] {
			ds = append(ds, x.d)
			sum += x.d
		}
		slices.Sort(ds)
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s |\n", p, len(ds), ms(quantile(ds, 0.5)), ms(quantile(ds, 0.99)), ms(ds[len(ds)-1]), ms(sum/time.Duration(len(ds))))
	}
}

func (s *stats) writeCSV(path string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	fmt.Fprintln(f, "cycle,phase,ms")
	for _, p := range s.order {
		for _, x := range s.samples[p] {
			fmt.Fprintf(f, "%d,%s,%s\n", x.cycle, p, ms(x.d))
		}
	}
	return f.Close()
}

// hangError is a phase or background call that outlived the cycle timeout.
type hangError struct{ what string }

func (e *hangError) Error() string { return e.what }

// background runs the aborts and destroys that recovery does not wait for,
// as worker/ncclcomm does, times them, and turns one that outlives the
// timeout into a hang.
type background struct {
	timeout time.Duration
	stats   *stats
	mu      sync.Mutex
	next    int
	pending map[int]pendingCall
	errs    []error
	wg      sync.WaitGroup
}

type pendingCall struct {
	what  string
	cycle int
	since time.Time
}

func (bg *background) start(what string, cycle int, f func() error) {
	bg.mu.Lock()
	if bg.pending == nil {
		bg.pending = map[int]pendingCall{}
	}
	id := bg.next
	bg.next++
	since := time.Now()
	bg.pending[id] = pendingCall{what, cycle, since}
	bg.mu.Unlock()
	bg.wg.Add(1)
	go func() {
		defer bg.wg.Done()
		err := f()
		d := time.Since(since)
		bg.stats.add(cycle, what, d)
		bg.mu.Lock()
		defer bg.mu.Unlock()
		delete(bg.pending, id)
		if err != nil {
			bg.errs = append(bg.errs, fmt.Errorf("cycle %d: %s: %w", cycle, what, err))
		}
	}()
}

// check reports the first background error, or a call past the timeout.
func (bg *background) check(cycle int) error {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	if len(bg.errs) > 0 {
		return errors.Join(bg.errs...)
	}
	for _, p := range bg.pending {
		if time.Since(p.since) > bg.timeout {
			return &hangError{fmt.Sprintf("%s of cycle %d not done after %v (checked after cycle %d)", p.what, p.cycle, bg.timeout, cycle)}
		}
	}
	return nil
}

// barrier waits for every background call, at most the timeout, and
// records how long it waited as phase name.
func (bg *background) barrier(cycle int, name string) error {
	start := time.Now()
	err := bg.wait()
	bg.stats.add(cycle, name, time.Since(start))
	return err
}

// wait waits for every background call, at most the timeout.
func (bg *background) wait() error {
	done := make(chan struct{})
	go func() { bg.wg.Wait(); close(done) }()
	select {
	case <-done:
		bg.mu.Lock()
		defer bg.mu.Unlock()
		return errors.Join(bg.errs...)
	case <-time.After(bg.timeout):
		bg.mu.Lock()
		defer bg.mu.Unlock()
		for _, p := range bg.pending {
			return &hangError{fmt.Sprintf("%s of cycle %d not done %v after the last cycle", p.what, p.cycle, bg.timeout)}
		}
		return nil
	}
}
