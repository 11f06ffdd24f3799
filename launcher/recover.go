package launcher

import (
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// In-process recovery, the agent's half (package worker has the other). A
// worker that runs worker.Run says so in its hello (WorkerHello.recoverable).
// When its generation ends and it is still running, the machine
// (launcher/agentcore) does not stop it: the agent sends it
// GenerationChange{ended} and reports it parked; the coordinator counts it
// as accounted for and marks it a survivor of the next generation. Then the
// agent hands that generation to the running process
// (GenerationChange{started}) instead of starting a new one, so only the
// ranks whose processes are gone start again. actions.go carries out Park
// and Resume; this file has the hub's side.

// rehello takes a later hello on an open stream: worker.Run sends one to say
// the worker is recoverable.
func (h *hub) rehello(w *attachedWorker, hello *gotrainv1.WorkerHello) {
	h.mu.Lock()
	w.recoverable = hello.GetRecoverable()
	notify := h.onAttach
	h.mu.Unlock()
	if notify != nil {
		notify(w, hello.GetRecoverable())
	}
}

// workerByPid returns the open control stream of process pid, nil when it
// has none.
func (h *hub) workerByPid(pid int) *attachedWorker {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.streams[pid]
}

// rebind attaches a surviving worker's stream to its rank in generation gen
// (a survivor's rank changes when the job shrinks or grows).
func (h *hub) rebind(gen int64, rank int, w *attachedWorker) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.ranks[rank]; s != nil && h.gen == gen && w != nil {
		s.worker = w
		w.gen, w.rank = gen, rank
	}
}

func generationChange(gc *gotrainv1.GenerationChange) *gotrainv1.AgentMessage {
	return &gotrainv1.AgentMessage{Msg: &gotrainv1.AgentMessage_Generation{Generation: gc}}
}
