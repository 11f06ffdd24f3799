package gossip

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gotrain/gotrain/internal/connguard"
)

// Connection bounds of a gossip port's TCP side (without
// them a flood took 20 000 descriptors in seconds). Memberlist opens a TCP
// connection for a push/pull sync or a fallback probe and closes it after
// one exchange; it authenticates none (the key decrypts the first message,
// deep inside memberlist), so every one counts as unauthenticated: a
// member's single connection is evicted only by its own source's, never by
// a flood from others. The deadline is memberlist's own for a stream.
const (
	MaxStreams          = 1024
	MaxStreamsPerSource = 64
	StreamTimeout       = 10 * time.Second
)

// StreamLimits are a gossip port's TCP bounds (its UDP side holds no
// descriptors per peer).
var StreamLimits = connguard.Limits{Unauthenticated: MaxStreams, UnauthenticatedPerSource: MaxStreamsPerSource, HandshakeTimeout: StreamTimeout}

// boundedTransport is memberlist's own NetTransport with its stream
// connections brought within StreamLimits as they come out of it:
// NetTransport accepts them itself and takes no listener of ours.
type boundedTransport struct {
	*memberlist.NetTransport
	guard   *connguard.Guard
	streams chan net.Conn
	quit    chan struct{} // Shutdown began: no more streams to memberlist
	netDone chan struct{} // the NetTransport is shut down: nothing more comes
	wg      sync.WaitGroup
	once    sync.Once
}

// newTransport listens on c's address and port (a free one for 0, which
// it writes back into c, as memberlist does for its own transport).
func newTransport(c *memberlist.Config, logger *slog.Logger) (*boundedTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{c.BindAddr}, BindPort: c.BindPort, Logger: c.Logger}
	var nt *memberlist.NetTransport
	var err error
	// Port 0 picks a TCP port, then binds UDP to the same one, which may be
	// taken: try again, as memberlist does.
	for range 10 {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || c.BindPort != 0 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if c.BindPort == 0 {
		c.BindPort = nt.GetAutoBindPort()
		c.AdvertisePort = c.BindPort
	}
	t := &boundedTransport{NetTransport: nt, streams: make(chan net.Conn), quit: make(chan struct{}), netDone: make(chan struct{}),
		guard: connguard.New(fmt.Sprintf("the gossip port %d", c.BindPort), StreamLimits, logger)}
	t.wg.Add(1)
	go t.forward()
	return t, nil
}

var _ memberlist.NodeAwareTransport = (*boundedTransport)(nil)

// forward hands memberlist the stream connections within the bounds.
func (t *boundedTransport) forward() {
	defer t.wg.Done()
	for {
		select {
		case c := <-t.NetTransport.StreamCh():
			gc := t.guard.Admit(c)
			if gc == nil {
				continue
			}
			select {
			case t.streams <- gc:
			case <-t.quit:
				_ = gc.Close()
			}
		case <-t.netDone:
			return
		}
	}
}

// StreamCh is the stream connections within the bounds.
func (t *boundedTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown stops the NetTransport (forward keeps taking what it still
// accepts, which it closes) and waits for forward.
func (t *boundedTransport) Shutdown() error {
	var err error
	t.once.Do(func() {
		close(t.quit)
		err = t.NetTransport.Shutdown()
		close(t.netDone)
		t.wg.Wait()
	})
	return err
}
