package memsnap

import (
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
)

// Sources of a snapshot.
const (
	SourceOwn  = "agent" // written by a worker of this node
	SourcePeer = "peer"  // a replica of a peer node's worker
)

var (
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	ieee       = crc32.IEEETable
)

// Checksum is the CRC-32C of b, the checksum snapshots carry (on several
// cores for a large b).
func Checksum(b []byte) uint32 { return crcOf(b, castagnoli, polyCastagnoli) }

// SumIEEE names CRC-32 (IEEE), the checksum older Python workers computed.
const SumIEEE = "crc32"

// SumByAgent in a put asks the agent to compute the CRC-32C (on all its
// cores) instead of checking one the worker computed: a Python worker
// hands its snapshot over without reading it again. The snapshot is kept
// with its CRC-32C, as a Go worker's.
const SumByAgent = "agent"

// checksumBy is b's checksum named sum ("" or SumIEEE).
func checksumBy(sum string, b []byte) (uint32, error) {
	switch sum {
	case "":
		return Checksum(b), nil
	case SumIEEE:
		return crcOf(b, ieee, polyIEEE), nil
	}
	return 0, fmt.Errorf("memsnap: unknown checksum %q", sum)
}

// Errors of Commit.
var (
	ErrTooLarge = errors.New("memsnap: the snapshot does not fit in the agent's snapshot memory")
	ErrTorn     = errors.New("memsnap: the snapshot does not match its length or checksum")
)

// Snapshot is one complete, sealed snapshot the store holds. Its bytes are
// a read-only mapping of the memfd; they stay valid until Release.
type Snapshot struct {
	Rank   int
	Step   int64
	Size   int64
	CRC    uint32
	Source string
	Sealed bool   // nothing can change it; else the worker reuses the memfd later
	Sum    string // the checksum's name: "" (CRC-32C) or SumIEEE
	// MAC is the MAC of its facts by the job's snapshot key (mac.go): the
	// agent's own when a worker of this node wrote it, the sender's when a
	// replica; nil while the agent has no key.
	MAC []byte

	fd   int
	data []byte
	refs int // the store's reference and every Acquire's; guarded by Store.mu
}

// Bytes returns the snapshot's contents (read-only).
func (s *Snapshot) Bytes() []byte { return s.data }

// Store keeps the newest complete snapshot of each rank. It is safe for
// concurrent use.
type Store struct {
	limit int64 // bytes, own and peer snapshots together; 0: no limit

	mu        sync.Mutex
	latest    map[slot]*Snapshot
	held      int64
	key       []byte           // the job's snapshot key (SetKey); nil: none yet
	receiving map[int]*Receipt // replicas being received, by rank
}

// slot is where the store keeps a snapshot: a rank's own (written by a
// worker of this node) and its replica from a peer are apart, so that a
// replica arriving late never replaces what a worker here wrote.
type slot struct {
	rank int
	peer bool
}

// NewStore returns a store that holds at most limit bytes (0: no limit).
func NewStore(limit int64) *Store {
	return &Store{limit: limit, latest: map[slot]*Snapshot{}, receiving: map[int]*Receipt{}}
}

// SetKey sets the job's snapshot key (mac.go): from now on every snapshot a
// worker hands over gets its MAC, and replicas must carry a valid one.
func (st *Store) SetKey(key []byte) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.key = append([]byte(nil), key...)
}

// Commit makes the memfd fd, which a worker of rank wrote and says holds
// size bytes with checksum crc for step, the rank's newest snapshot. Commit
// owns fd from now on (closed on any error). It seals fd, so that nothing
// changes it any more, and checks length and checksum before the previous
// snapshot is replaced: when anything does not match, the previous one
// stays.
func (st *Store) Commit(rank int, step int64, fd int, size int64, crc uint32, source string) (*Snapshot, error) {
	return st.commit(rank, step, fd, size, crc, "", source, true, nil, nil)
}

// CommitSum is Commit for a snapshot whose checksum is named sum ("" for
// CRC-32C, SumIEEE); reuse says whether the worker keeps the memfd.
func (st *Store) CommitSum(rank int, step int64, fd int, size int64, crc uint32, sum, source string, reuse bool) (*Snapshot, error) {
	return st.commit(rank, step, fd, size, crc, sum, source, !reuse, nil, nil)
}

// CommitChecked is CommitSum with check, which sees the snapshot's bytes
// (sealed, or checksummed) and refuses it with an error before it replaces
// the rank's previous one.
func (st *Store) CommitChecked(rank int, step int64, fd int, size int64, crc uint32, sum, source string, reuse bool, check func([]byte) error) (*Snapshot, error) {
	return st.commit(rank, step, fd, size, crc, sum, source, !reuse, check, nil)
}

// CommitReused is Commit for a memfd the worker keeps and writes a later
// snapshot into once this one is replaced (it alternates two): it is not
// sealed, so the checksum is checked here and by every reader.
func (st *Store) CommitReused(rank int, step int64, fd int, size int64, crc uint32, source string) (*Snapshot, error) {
	return st.commit(rank, step, fd, size, crc, "", source, false, nil, nil)
}

// commit keeps a snapshot once check (when set) passes on its bytes; mac
// is a replica's (checked by the caller), an own snapshot's is computed
// here.
func (st *Store) commit(rank int, step int64, fd int, size int64, crc uint32, sum, source string, sealIt bool, check func([]byte) error, mac []byte) (*Snapshot, error) {
	s, err := openChecked(rank, step, fd, size, crc, sum, source, sealIt)
	if err != nil {
		return nil, err
	}
	if check != nil {
		if err := check(s.data); err != nil {
			s.close()
			return nil, err
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	k := slot{rank, source == SourcePeer}
	old := st.latest[k]
	held := st.held
	if old != nil {
		held -= old.Size
	}
	if err := st.fitsLocked(k, s.Size, step); err != nil {
		s.close()
		return nil, err
	}
	switch {
	case k.peer:
		s.MAC = mac
	case len(st.key) > 0:
		s.MAC = MAC(st.key, rank, step, s.Size, s.CRC, s.Sum)
	}
	s.refs = 1
	st.latest[k] = s
	st.held = held + s.Size
	if old != nil {
		st.releaseLocked(old)
	}
	return s, nil
}

// openChecked seals fd (when sealIt) and checks it against size and crc.
func openChecked(rank int, step int64, fd int, size int64, crc uint32, sum, source string, sealIt bool) (*Snapshot, error) {
	if size < 0 {
		closeFd(fd)
		return nil, fmt.Errorf("%w: rank %d claims %d bytes", ErrTorn, rank, size)
	}
	if sealIt {
		if err := seal(fd); err != nil && !sealed(fd) {
			closeFd(fd)
			return nil, fmt.Errorf("rank %d, step %d: %w", rank, step, err)
		}
	}
	n, err := fileSize(fd)
	if err != nil {
		closeFd(fd)
		return nil, fmt.Errorf("rank %d, step %d: size of the memfd: %w", rank, step, err)
	}
	if n != size {
		closeFd(fd)
		return nil, fmt.Errorf("%w: rank %d's snapshot of step %d holds %d bytes, it claims %d", ErrTorn, rank, step, n, size)
	}
	data, err := mapReadOnly(fd, size)
	if err != nil {
		closeFd(fd)
		return nil, fmt.Errorf("rank %d, step %d: %w", rank, step, err)
	}
	if sum == SumByAgent {
		sum, crc = "", Checksum(data)
	}
	got, err := checksumBy(sum, data)
	if err != nil {
		unmap(data)
		closeFd(fd)
		return nil, err
	}
	if got != crc {
		unmap(data)
		closeFd(fd)
		return nil, fmt.Errorf("%w: rank %d's snapshot of step %d has CRC-32C %08x, it claims %08x (written while being handed over?)", ErrTorn, rank, step, got, crc)
	}
	return &Snapshot{Rank: rank, Step: step, Size: size, CRC: crc, Source: source, Sealed: sealed(fd), Sum: sum, fd: fd, data: data}, nil
}

// fitsLocked is ErrTooLarge, with the figures, when a snapshot of size
// bytes in k would take the store over its limit (the one k holds now is
// replaced, so it does not count; replicas being received do, but that of
// k's rank when k is a replica's: it is the one being committed).
func (st *Store) fitsLocked(k slot, size, step int64) error {
	held := st.held + st.receivingLocked(k)
	if old := st.latest[k]; old != nil {
		held -= old.Size
	}
	if st.limit <= 0 || held+size <= st.limit {
		return nil
	}
	what := "snapshot"
	if k.peer {
		what = "replica (from a peer node)"
	}
	return fmt.Errorf("%w: rank %d's %s of step %d is %d bytes, the agent holds %d bytes of others' (own and peers' replicas) and --snapshot-memory is %d bytes; raise --snapshot-memory or snapshot less state",
		ErrTooLarge, k.rank, what, step, size, held, st.limit)
}

// Fits says whether a replica of rank of size bytes would fit (ErrTooLarge
// when not), so that a peer is refused before it sends the bytes.
func (st *Store) Fits(rank int, size, step int64) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.fitsLocked(slot{rank, true}, size, step)
}

// Acquire returns rank's newest snapshot, which stays valid (even once a
// newer one replaces it) until Release; false when the store has none.
func (st *Store) Acquire(rank int) (*Snapshot, bool) { return st.acquire(slot{rank, false}) }

// AcquireReplica is Acquire for the replica of rank a peer sent.
func (st *Store) AcquireReplica(rank int) (*Snapshot, bool) { return st.acquire(slot{rank, true}) }

func (st *Store) acquire(k slot) (*Snapshot, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.latest[k]
	if s == nil {
		return nil, false
	}
	s.refs++
	return s, true
}

// Seal makes a snapshot whose worker kept its memfd (CommitReused)
// immutable once no writable mapping of it is left, which is the case as
// soon as that worker exited, and checks it again; from then on a reader
// need not check it (the kernel forbids every change). It reports whether
// s is sealed: false, with no error, while its worker still maps it.
// ErrTorn when it changed after it was handed over: it is dropped.
func (st *Store) Seal(s *Snapshot) (bool, error) {
	st.mu.Lock()
	done := s.Sealed
	st.mu.Unlock()
	if done {
		return true, nil
	}
	if err := seal(s.fd); err != nil && !sealed(s.fd) {
		return false, nil // EBUSY: its writer maps it writable still
	}
	got, err := checksumBy(s.Sum, s.data)
	st.mu.Lock()
	defer st.mu.Unlock()
	if err == nil && got != s.CRC {
		err = fmt.Errorf("%w: rank %d's snapshot of step %d has CRC-32C %08x now, %08x when it was handed over (its worker wrote it after the hand-over); dropped", ErrTorn, s.Rank, s.Step, got, s.CRC)
		k := slot{s.Rank, s.Source == SourcePeer}
		if st.latest[k] == s {
			delete(st.latest, k)
			st.held -= s.Size
			st.releaseLocked(s)
		}
		return false, err
	}
	if err != nil {
		return false, err
	}
	s.Sealed = true
	return true, nil
}

// Release gives back a snapshot Acquire returned.
func (st *Store) Release(s *Snapshot) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.releaseLocked(s)
}

func (st *Store) releaseLocked(s *Snapshot) {
	s.refs--
	if s.refs == 0 {
		s.close()
	}
}

func (s *Snapshot) close() {
	unmap(s.data)
	closeFd(s.fd)
	s.data, s.fd = nil, -1
}

// Drop forgets rank's snapshot (a rank that no longer exists).
func (st *Store) Drop(rank int) { st.drop(slot{rank, false}) }

func (st *Store) drop(k slot) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s := st.latest[k]; s != nil {
		delete(st.latest, k)
		st.held -= s.Size
		st.releaseLocked(s)
	}
}

// Held returns the bytes the store holds.
func (st *Store) Held() int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.held
}

// Info is what the store holds of one rank.
type Info struct {
	Rank   int
	Step   int64
	Size   int64
	Source string
}

// List returns what the store holds, by rank.
func (st *Store) List() []Info {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]Info, 0, len(st.latest))
	for k, s := range st.latest {
		out = append(out, Info{Rank: k.rank, Step: s.Step, Size: s.Size, Source: s.Source})
	}
	slices.SortFunc(out, func(a, b Info) int { return cmp.Or(cmp.Compare(a.Rank, b.Rank), cmp.Compare(a.Source, b.Source)) })
	return out
}

// Close releases every snapshot the store holds.
func (st *Store) Close() {
	st.mu.Lock()
	keys := make([]slot, 0, len(st.latest))
	for k := range st.latest {
		keys = append(keys, k)
	}
	st.mu.Unlock()
	for _, k := range keys {
		st.drop(k)
	}
}

// CommitReplica is Commit for a replica a peer node sent (sealed): it is
// kept only when mac is the MAC of its facts by the job's key (mac.go).
func (st *Store) CommitReplica(rank int, step int64, fd int, size int64, crc uint32, sum string, mac []byte) (*Snapshot, error) {
	if err := st.CheckMAC(rank, step, size, crc, sum, mac); err != nil {
		closeFd(fd)
		return nil, err
	}
	return st.commit(rank, step, fd, size, crc, sum, SourcePeer, true, nil, append([]byte(nil), mac...))
}

// CheckMAC is nil when mac is the MAC of a snapshot's facts by the job's
// key; ErrMAC when not, or when the agent has no key yet (it cannot tell
// a replica of this job's agents from a forged one).
func (st *Store) CheckMAC(rank int, step, size int64, crc uint32, sum string, mac []byte) error {
	st.mu.Lock()
	key := st.key
	st.mu.Unlock()
	if len(key) == 0 {
		return fmt.Errorf("%w: rank %d's snapshot of step %d: this agent has no snapshot key yet (it gets it with its first generation)", ErrMAC, rank, step)
	}
	return checkMAC(key, rank, step, size, crc, sum, mac)
}

// CheckFetched checks the MAC of f, a replica of rank fetched from a peer,
// before it is served to a worker; on an error f's memfd is closed.
func (st *Store) CheckFetched(rank int, f Fetched) error {
	err := st.CheckMAC(rank, f.Step, f.Size, f.CRC, f.Sum, f.MAC)
	if err != nil {
		closeFd(f.Fd)
	}
	return err
}

// Receipt counts the bytes of a replica being received against the
// store's limit as they arrive, rather than the size the sender claims:
// a sender that claims much and sends little holds no memory it did not
// send, and several streams together cannot take the store over its limit.
// The bytes of a rank's replica count only beyond those of the replica of
// that rank the store holds (which it replaces once complete), so that a
// replica as large as half the limit can still be replaced.
type Receipt struct {
	st   *Store
	rank int
	step int64
	got  int64 // guarded by st.mu
}

// ErrBusy: a replica of the rank is being received already.
var ErrBusy = errors.New("memsnap: a replica of this rank is being received already")

// Receive starts receiving rank's replica of step, which claims size
// bytes: ErrTooLarge when that alone does not fit, ErrBusy while another
// replica of rank is being received. Done ends it.
func (st *Store) Receive(rank int, step, size int64) (*Receipt, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.fitsLocked(slot{rank, true}, size, step); err != nil {
		return nil, err
	}
	if r := st.receiving[rank]; r != nil {
		return nil, fmt.Errorf("%w: rank %d's replica of step %d has %d bytes in (a second sender of the same rank is refused)", ErrBusy, rank, r.step, r.got)
	}
	r := &Receipt{st: st, rank: rank, step: step}
	st.receiving[rank] = r
	return r, nil
}

// Grow counts n more bytes of the replica: ErrTooLarge, with the figures,
// when they take the store over its limit (the receipt then stops).
func (r *Receipt) Grow(n int) error {
	st := r.st
	st.mu.Lock()
	defer st.mu.Unlock()
	r.got += int64(n)
	if st.limit <= 0 {
		return nil
	}
	if used := st.held + st.receivingLocked(slot{-1, false}); used > st.limit {
		return fmt.Errorf("%w: rank %d's replica of step %d reached %d bytes while the agent holds %d bytes of snapshots and replicas, with the replicas being received, and --snapshot-memory is %d bytes; raise --snapshot-memory there, or snapshot less state",
			ErrTooLarge, r.rank, r.step, r.got, used, st.limit)
	}
	return nil
}

// Done ends the receipt: its bytes no longer count (committed, they count
// as the replica's).
func (r *Receipt) Done() {
	st := r.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.receiving[r.rank] == r {
		delete(st.receiving, r.rank)
	}
}

// receivingLocked is the bytes of the replicas being received beyond
// those of the replicas they replace, but for that of except's rank when
// except is a replica's slot.
func (st *Store) receivingLocked(except slot) int64 {
	var n int64
	for rank, r := range st.receiving {
		if except.peer && rank == except.rank {
			continue
		}
		extra := r.got
		if old := st.latest[slot{rank, true}]; old != nil {
			extra -= old.Size
		}
		n += max(0, extra)
	}
	return n
}
