package relay

import (
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// In-process recovery, the agent's half (package worker has the other). A
// worker that runs worker.Run says so in its hello (WorkerHello.recoverable).
// When its generation ends and it is still running, the machine
// (internal/launcher/agentcore) does not stop it: the agent sends it
// GenerationChange{ended} and reports it parked; the coordinator counts it
// as accounted for and marks it a survivor of the next generation. Then the
// agent hands that generation to the running process
// (GenerationChange{started}) instead of starting a new one, so only the
// ranks whose processes are gone start again. The agent
// (internal/launcher/actions.go) carries out Park and Resume; this file has the
// hub's side.

// rehello takes a later hello on an open stream: worker.Run sends one to say
// the worker is recoverable.
func (h *Hub) rehello(w *attachedWorker, hello *gotrainv1.WorkerHello) {
	h.mu.Lock()
	w.recoverable = hello.GetRecoverable()
	notify := h.onAttach
	h.mu.Unlock()
	if notify != nil {
		notify(w.pid, w.rank, w.gen, hello.GetRecoverable())
	}
}

// workerByPid returns the open control stream of process pid, nil when it
// has none.
func (h *Hub) workerByPid(pid int) *attachedWorker {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.streams[pid]
}

// Rebind attaches the open stream of surviving worker pid to its rank in
// generation gen (a survivor's rank changes when the job shrinks or grows).
func (h *Hub) Rebind(gen int64, rank, pid int) {
	h.rebind(gen, rank, h.workerByPid(pid))
}

func (h *Hub) rebind(gen int64, rank int, w *attachedWorker) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.ranks[rank]; s != nil && h.gen == gen && w != nil {
		s.worker = w
		w.gen, w.rank = gen, rank
	}
}

// Send sends m on process pid's control stream without waiting; it
// reports whether it did (false when it has none, or it is full).
func (h *Hub) Send(pid int, m *gotrainv1.AgentMessage) bool {
	w := h.workerByPid(pid)
	if w == nil {
		return false
	}
	select {
	case w.out <- m:
		return true
	default:
		return false
	}
}
