package workerenv

import (
	"slices"
	"testing"
)

// The cases are Python's string.Template(arg).safe_substitute(local_rank="1"),
// what torchrun does to each argument, except "$$", which stays.
func TestSubstituteLocalRank(t *testing.T) {
	for in, want := range map[string]string{
		"${local_rank}":                "1",
		"--rank=${local_rank}":         "--rank=1",
		"$local_rank":                  "1",
		"a$local_rank.b":               "a1.b",
		"$local_ranks":                 "$local_ranks",
		"${local_rank":                 "${local_rank",
		"${local_rank}}":               "1}",
		"${LOCAL_RANK}":                "${LOCAL_RANK}",
		"$LOCAL_RANK":                  "$LOCAL_RANK",
		"x${local_rank}y${local_rank}": "x1y1",
		"$local_rank$local_rank":       "11",
		"${other} $local_rank":         "${other} 1",
		"local_rank":                   "local_rank",
		"$ local_rank":                 "$ local_rank",
		"a$":                           "a$",
		// Template's escape protects what follows; it would also become "$".
		"$${local_rank}":  "$${local_rank}",
		"$$local_rank":    "$$local_rank",
		"$$$local_rank":   "$$1",
		"echo $$ $RANK":   "echo $$ $RANK",
		"":                "",
		"$local_rank\x00": "1\x00",
	} {
		if got := SubstituteLocalRank([]string{in}, 1); !slices.Equal(got, []string{want}) {
			t.Errorf("SubstituteLocalRank(%q) = %q, want %q", in, got, want)
		}
	}
	args := []string{"-c", "echo", "${local_rank}"}
	got := SubstituteLocalRank(args, 12)
	if !slices.Equal(got, []string{"-c", "echo", "12"}) || args[2] != "${local_rank}" {
		t.Errorf("got %q from %q; want the copy substituted and the original kept", got, args)
	}
	if plain := []string{"a", "b"}; &SubstituteLocalRank(plain, 0)[0] != &plain[0] {
		t.Error("args without the macro were copied")
	}
	if SubstituteLocalRank(nil, 0) != nil {
		t.Error("nil args became non-nil")
	}
}
