package torchrun

import (
	"strconv"
	"strings"
)

// commandLine is torchrun's command line as its argparse reads it: the
// flags given (by their dash spelling, values as given: "true" for a
// boolean), in order, then the script and its own arguments.
type commandLine struct {
	set        map[string]string
	given      []string // flag names in command-line order, for the notes
	script     string
	scriptArgs []string
}

// scan reads args up to the script: --flag=value and --flag value in either
// spelling, argparse's unambiguous abbreviations, -m, -r and -t, and "--"
// before the script.
func scan(args []string) (commandLine, error) {
	cl := commandLine{set: map[string]string{}, given: []string{}}
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if !isFlagArg(a) {
			break
		}
		name, value, next, err := scanFlag(args, i)
		if err != nil {
			return commandLine{}, err
		}
		i = next
		cl.set[name] = value
		cl.given = append(cl.given, name)
	}
	if i >= len(args) {
		return commandLine{}, usage("no training script given")
	}
	cl.script, cl.scriptArgs = args[i], args[i+1:]
	return cl, nil
}

// isFlagArg says whether a is a flag rather than the script ("-" alone is
// a script name, as for argparse).
func isFlagArg(a string) bool { return strings.HasPrefix(a, "-") && a != "-" }

func isNumber(s string) bool { _, err := strconv.ParseFloat(s, 64); return err == nil }

// scanFlag reads the flag at args[i]: its name (dash spelling), its value,
// and the index of the last argument it took.
func scanFlag(args []string, i int) (name, value string, last int, err error) {
	a := args[i]
	switch long, short := shortFlags[shortName(a)]; {
	case a == "-m":
		return "module", "true", i, nil
	case short:
		// torchrun's -r/-t: the value after it, =, or joined (-r3).
		a = "--" + long + "=" + strings.TrimPrefix(a[2:], "=")
		if len(args[i]) == 2 {
			if i+1 == len(args) {
				return "", "", 0, usage("%s needs a value", args[i])
			}
			i++
			a += args[i]
		}
	case !strings.HasPrefix(a, "--"):
		return "", "", 0, usage("flag provided but not defined: -%s", flagName(a))
	}
	name, value, hasValue := strings.Cut(a[2:], "=")
	name, k, err := flagKind(strings.ReplaceAll(name, "_", "-"), a)
	if err != nil {
		return "", "", 0, err
	}
	switch {
	case k == boolean && hasValue:
		return "", "", 0, usage("%s takes no value", a)
	case k == boolean:
		value = "true"
	case !hasValue:
		// As argparse: the next argument is the value unless it is a flag
		// (a negative number is a value).
		if i+1 == len(args) || isFlagArg(args[i+1]) && !isNumber(args[i+1]) {
			return "", "", 0, usage("%s needs a value", a)
		}
		i++
		value = args[i]
	}
	return name, value, i, nil
}

// flagKind is torchrun's flag name (dash spelling) names, or the one flag it
// abbreviates, and its kind; refused and unknown flags are errors (a is
// the argument, for them).
func flagKind(name, a string) (string, kind, error) {
	if why, ok := refused[name]; ok {
		return "", 0, usage("--%s (torchrun 2.x) is not supported: %s", name, why)
	}
	if k, ok := flags[name]; ok {
		return name, k, nil
	}
	// argparse's abbreviations: a prefix of one flag alone.
	full, err := byPrefix(name)
	if err != nil {
		return "", 0, err
	}
	if full == "" {
		return "", 0, usage("flag provided but not defined: -%s", flagName(a))
	}
	return full, flags[full], nil
}
