package job

// NodeOfRank returns the node that runs rank in generation gen, and false
// when gen is not the current generation or rank is not one of its ranks.
// The coordinator lets only that node speak for the rank (its identity
// checks); the lookup is constant time.
func (m *Machine) NodeOfRank(gen int64, rank int) (string, bool) {
	if m.gen < 0 || gen != m.gen || rank < 0 || rank >= len(m.ranks) {
		return "", false
	}
	return m.ranks[rank].nodeID, true
}

// Generation is the current generation, -1 before the first.
func (m *Machine) Generation() int64 { return m.gen }

// NodeOfGroupRank returns the node of group rank gr in generation gen, and
// false when gen is not the current generation or no node has that group
// rank in it (the snapshot tier's address keys: only that node may put
// them).
func (m *Machine) NodeOfGroupRank(gen int64, gr int) (string, bool) {
	if m.gen < 0 || gen != m.gen || gr < 0 {
		return "", false
	}
	for id, n := range m.nodes {
		if n.groupRank == gr {
			return id, true
		}
	}
	return "", false
}
