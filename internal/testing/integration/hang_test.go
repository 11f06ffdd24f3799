package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// Hang diagnosis end to end: three CPU ranks run testprog's training loop;
// rank 1 misbehaves at step 3 (collective #3). With --hang-timeout 5s the
// verdict must name rank 1 and #3, not before the hang timeout, in the
// launcher's output and in `gotrain diagnose`.

const (
	hangTimeout = 5 * time.Second
	// verdictLimit bounds the wait for a verdict after the fault. It is
	// generous on purpose (the detector's own latency is a second or two;
	// a loaded machine or parallel tests add to it): what the tests check
	// is that the verdict comes, names the culprit, and not too early.
	verdictLimit = 30 * time.Second
	faultStep    = 3
	faultRank    = 1
)

// line is one line of a running launch's output and when the test read it.
type line struct {
	text string
	at   time.Time
}

// running is a `gotrain launch` in the background.
type running struct {
	cmd   *exec.Cmd
	lines chan line
	done  chan struct{}
	env   []string
	log   strings.Builder // everything read, for failure messages
}

func startLaunch(t *testing.T, runtimeDir string, args ...string) *running {
	t.Helper()
	return startLaunchEnv(t, []string{"XDG_RUNTIME_DIR=" + runtimeDir}, args...)
}

// startLaunchEnv is startLaunch with env added to gotrain's environment.
func startLaunchEnv(t *testing.T, env []string, args ...string) *running {
	t.Helper()
	r := &running{lines: make(chan line, 1024), done: make(chan struct{})}
	r.cmd = gotrainCmd(context.Background(), t, env, args...)
	r.env = r.cmd.Env
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errOut, err := r.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pumps := make(chan struct{}, 2)
	for _, rd := range []io.Reader{out, errOut} {
		go func() {
			sc := bufio.NewScanner(rd)
			for sc.Scan() {
				r.lines <- line{sc.Text(), time.Now()}
			}
			pumps <- struct{}{}
		}()
	}
	go func() { <-pumps; <-pumps; _ = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			_ = r.cmd.Process.Kill()
		}
	})
	return r
}

// waitFor returns the first line matching re, failing after timeout or when
// the launcher exits first.
func (r *running) waitFor(t *testing.T, re *regexp.Regexp, timeout time.Duration) line {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-r.lines:
			r.log.WriteString(l.text + "\n")
			if re.MatchString(l.text) {
				return l
			}
		case <-r.done:
			// Drain what is left, then give up.
			for {
				select {
				case l := <-r.lines:
					r.log.WriteString(l.text + "\n")
					if re.MatchString(l.text) {
						return l
					}
				default:
					t.Fatalf("gotrain exited (%v) before a line matched %q; output:\n%s", r.cmd.ProcessState, re, r.log.String())
				}
			}
		case <-deadline:
			t.Fatalf("no line matched %q within %s; output:\n%s", re, timeout, r.log.String())
		}
	}
}

var faultLine = regexp.MustCompile(`FAULT \w+ rank (\d+) seq (\d+) unix_ms (\d+)`)

// faultTime returns when the fault happened, from the worker's own clock.
func faultTime(t *testing.T, l line) time.Time {
	m := faultLine.FindStringSubmatch(l.text)
	ms, err := strconv.ParseInt(m[3], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.UnixMilli(ms)
}

func diagnose(t *testing.T, r *running) *gotrainv1.DiagnoseResponse {
	t.Helper()
	// diagnose answers within a second on an idle machine; the bound here
	// only catches one that does not answer at all.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.gotrain, "diagnose", "--json")
	cmd.Env = r.env
	start := time.Now()
	out, err := cmd.Output()
	var ee *exec.ExitError
	hang := errors.As(err, &ee) && ee.ExitCode() == 3 // diagnose's status for a hang verdict
	if err != nil && !hang {
		t.Fatalf("gotrain diagnose --json (after %s): %v\n%s", time.Since(start).Round(time.Millisecond), err, out)
	}
	var resp gotrainv1.DiagnoseResponse
	if err := protojson.Unmarshal(out, &resp); err != nil {
		t.Fatalf("diagnose --json output does not parse: %v\n%s", err, out)
	}
	if verdicts := len(resp.GetStatus().GetVerdicts()) > 0; verdicts != hang {
		t.Errorf("gotrain diagnose --json: exit %v with %d verdict(s); want exit 3 exactly when there is a verdict", err, len(resp.GetStatus().GetVerdicts()))
	}
	return &resp
}

func TestHangVerdicts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fault string
		kind  string // the verdict's kind
		// fails: the CPU backend sees the mismatch in its collective header
		// and the job fails at once; the failure names the mismatch.
		fails bool
		words string // in the verdict's summary
	}{
		{fault: "skip", kind: "never-entered", words: "never entered allreduce #3"},
		{fault: "spin", kind: "never-entered", words: "never entered allreduce #3"},
		{fault: "stop", kind: "process", words: "is stopped (process state T"},
		{fault: "op", kind: "mismatch", fails: true, words: "called allgather (float32, 1024 elements)"},
		{fault: "count", kind: "mismatch", fails: true, words: "called allreduce (float32 sum, 1025 elements)"},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			t.Parallel()
			r := startLaunch(t, t.TempDir(), "launch", "--nproc-per-node", "3", "--backend", "cpu", "--max-restarts", "0",
				"--hang-timeout", hangTimeout.String(), "--grace-period", "1s", "--",
				bin.testprog, "hang", "--fault", tc.fault, "--fault-rank", strconv.Itoa(faultRank),
				"--fault-step", strconv.Itoa(faultStep), "--step-time", "300ms")
			fl := r.waitFor(t, faultLine, 60*time.Second) // process start may be slow on a loaded machine
			began := faultTime(t, fl)
			if tc.fails {
				// The job fails; its failure message names the mismatch.
				want := regexp.MustCompile(fmt.Sprintf(`mismatch at #%d of comm "hang": rank %d \(pid \d+ on [^)]+\) %s`, faultStep, faultRank, regexp.QuoteMeta(tc.words)))
				l := r.waitFor(t, want, verdictLimit+5*time.Second)
				if d := l.at.Sub(began); d > verdictLimit {
					t.Errorf("the mismatch was reported %s after the fault; want within %s", d, verdictLimit)
				}
				t.Logf("%s: verdict %s after the fault: %s", tc.fault, l.at.Sub(began).Round(10*time.Millisecond), l.text)
				<-r.done
				if r.cmd.ProcessState.ExitCode() == 0 {
					t.Error("the job succeeded")
				}
				return
			}
			want := regexp.MustCompile(fmt.Sprintf(`^gotrain: hang detected \(%s, generation 0\): .*rank %d \(pid \d+ on [^)]+\) .*%s`, tc.kind, faultRank, regexp.QuoteMeta(tc.words)))
			l := r.waitFor(t, want, verdictLimit+5*time.Second)
			d := l.at.Sub(began)
			t.Logf("%s: verdict %s after the fault: %s", tc.fault, d.Round(10*time.Millisecond), l.text)
			if d > verdictLimit {
				t.Errorf("the verdict came %s after the fault; want within %s", d, verdictLimit)
			}
			if d < hangTimeout-time.Second {
				t.Errorf("the verdict came %s after the fault, before the hang timeout %s", d, hangTimeout)
			}
			resp := diagnose(t, r)
			vs := resp.GetStatus().GetVerdicts()
			if len(vs) != 1 {
				t.Fatalf("diagnose: %d verdicts, want 1: %v", len(vs), vs)
			}
			v := vs[0]
			if v.GetKind() != tc.kind || v.GetCollective().GetSeq() != faultStep || v.GetComm() != "hang" ||
				len(v.GetCulprits()) != 1 || v.GetCulprits()[0].GetRank() != faultRank || v.GetCulprits()[0].GetPid() == 0 {
				t.Errorf("diagnose verdict: %v", v)
			}
			if got := v.GetWaiting(); len(got) != 2 || got[0] != 0 || got[1] != 2 {
				t.Errorf("waiting ranks %v, want [0 2]", got)
			}
			if tc.fault == "skip" || tc.fault == "spin" {
				// The culprit's goroutine stacks arrive through its agent.
				fn := map[string]string{"skip": "main.otherWork", "spin": "main.spin"}[tc.fault]
				defer func() {
					if t.Failed() {
						t.Logf("rank %d's evidence: %v", faultRank, v.GetEvidence())
					}
				}()
				testkit.WaitFor(t, 30*time.Second, fmt.Sprintf("goroutine stacks of rank %d showing %s", faultRank, fn), func() bool {
					if hasStack(v, fn) {
						return true
					}
					v = diagnose(t, r).GetStatus().GetVerdicts()[0]
					return hasStack(v, fn)
				})
			}
		})
	}
}

func hasStack(v *gotrainv1.HangVerdict, fn string) bool {
	for _, e := range v.GetEvidence() {
		if e.GetKind() == "goroutines" && strings.Contains(e.GetText(), fn) {
			return true
		}
	}
	return false
}

// A healthy job whose compute steps outlast the hang timeout gets no verdict.
func TestHangLongStepsNoVerdict(t *testing.T) {
	t.Parallel()
	r := startLaunch(t, t.TempDir(), "launch", "--nproc-per-node", "3", "--backend", "cpu",
		"--hang-timeout", hangTimeout.String(), "--",
		bin.testprog, "hang", "--fault", "none", "--steps", "2", "--step-time", "6500ms")
	r.waitFor(t, regexp.MustCompile(`hang ok: 2 steps`), 90*time.Second)
	<-r.done
	for {
		select {
		case l := <-r.lines:
			r.log.WriteString(l.text + "\n")
			continue
		default:
		}
		break
	}
	if strings.Contains(r.log.String(), "hang detected") || r.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("a healthy job (exit %d) got a verdict:\n%s", r.cmd.ProcessState.ExitCode(), r.log.String())
	}
}
