package launcher

import (
	"slices"
	"strings"
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
		if got := substituteLocalRank([]string{in}, 1); !slices.Equal(got, []string{want}) {
			t.Errorf("substituteLocalRank(%q) = %q, want %q", in, got, want)
		}
	}
	args := []string{"-c", "echo", "${local_rank}"}
	got := substituteLocalRank(args, 12)
	if !slices.Equal(got, []string{"-c", "echo", "12"}) || args[2] != "${local_rank}" {
		t.Errorf("got %q from %q; want the copy substituted and the original kept", got, args)
	}
	if plain := []string{"a", "b"}; &substituteLocalRank(plain, 0)[0] != &plain[0] {
		t.Error("args without the macro were copied")
	}
	if substituteLocalRank(nil, 0) != nil {
		t.Error("nil args became non-nil")
	}
}

// Each worker's arguments get its own local rank, as under torchrun.
func TestAgentLocalRankInArgs(t *testing.T) {
	cfg, out := agentConfig(t, 2, `echo "rank $RANK args $1 $2 $3"`)
	cfg.Args = append(cfg.Args, "sh", "--local-rank=${local_rank}", "$local_rank.log", "${local_rank}")
	if err := Run(t.Context(), cfg); err != nil {
		t.Fatalf("Run: %v\n%s", err, out)
	}
	for _, want := range []string{"[rank 0] rank 0 args --local-rank=0 0.log 0", "[rank 1] rank 1 args --local-rank=1 1.log 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
