package job

import (
	"strconv"
	"strings"
)

// linuxSignals maps signal names, and the descriptions Go's syscall.Signal
// String method gives on Linux, to their numbers on Linux. The machine cannot
// import syscall's table (it must build and mean the same everywhere), and the
// exit code a launcher reports follows the shell's 128+n convention.
var linuxSignals = map[string]int{
	"SIGHUP": 1, "hangup": 1,
	"SIGINT": 2, "interrupt": 2,
	"SIGQUIT": 3, "quit": 3,
	"SIGILL": 4, "illegal instruction": 4,
	"SIGTRAP": 5, "trace/breakpoint trap": 5,
	"SIGABRT": 6, "aborted": 6,
	"SIGBUS": 7, "bus error": 7,
	"SIGFPE": 8, "floating point exception": 8,
	"SIGKILL": 9, "killed": 9,
	"SIGUSR1": 10, "user defined signal 1": 10,
	"SIGSEGV": 11, "segmentation fault": 11,
	"SIGUSR2": 12, "user defined signal 2": 12,
	"SIGPIPE": 13, "broken pipe": 13,
	"SIGALRM": 14, "alarm clock": 14,
	"SIGTERM": 15, "terminated": 15,
	"SIGXCPU": 24, "CPU time limit exceeded": 24,
	"SIGXFSZ": 25, "file size limit exceeded": 25,
	"SIGSYS": 31, "bad system call": 31,
}

// signalNumber returns the Linux number of the signal named s: "SIGKILL",
// "KILL", "killed" or "9".
func signalNumber(s string) (int, bool) {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil {
		return n, n > 0 && n < 128
	}
	if n, ok := linuxSignals[s]; ok {
		return n, true
	}
	n, ok := linuxSignals["SIG"+strings.ToUpper(s)]
	return n, ok
}
