// Package pystandby is the Python side of hot standbys: for a program run
// by a Python interpreter it reads the command line as the interpreter
// would (Parse), builds a standby's command (the same interpreter and
// options running the embedded pystandby.py bootstrap, which imports
// torch, initialises CUDA on the slot's GPU and waits), and talks to the
// bootstrap over a socket pair (Link): its "ready" or "error" as the
// machine's events, then one assignment, the rank's whole environment and
// program.
//
// It is separate from the agent (package launcher) because it is the
// agent's one protocol with Python: JSON lines over fd 3 and the bootstrap
// it embeds. The agent starts and supervises the process as any worker.
package pystandby
