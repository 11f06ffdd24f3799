package launcher

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The run id is never derived from the token: a joining
// agent has none until Join gives it the coordinator's.
func TestRunIDNotFromToken(t *testing.T) {
	c := Config{Coordinator: "127.0.0.1:29400", NodeAddress: "127.0.0.1"}
	c.JobToken = "abc"
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.RunID != "" {
		t.Errorf("run id %q before Join; want the coordinator's", c.RunID)
	}
}

// A refused Join reads as the coordinator's message, and still is the
// gRPC error underneath.
func TestJoinRefusedMessage(t *testing.T) {
	msg := "--max-restarts 5 on this node, but the job was started with --max-restarts 3: drop the flag on joining nodes or give the same value"
	err := error(&joinRefused{addr: "10.0.0.1:29400", err: status.Error(codes.FailedPrecondition, msg)})
	if want := "join the coordinator at 10.0.0.1:29400: " + msg; err.Error() != want {
		t.Errorf("got  %q\nwant %q", err, want)
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("code %v", status.Code(err))
	}
}
