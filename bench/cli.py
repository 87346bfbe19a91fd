"""Command line: run a sweep, set up environments, list what is known, re-render a report."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from bench import REPO_ROOT
from bench.analysis.exit_status import FAIL_ON_CHOICES, FAIL_ON_DEFAULT, parse_fail_on, runs_exit
from bench.catalog.registry import FAMILIES, PIPELINES, PROBES, RUNNERS
from bench.data.labelled import SOURCES
from bench.errors import ConfigError, write_remedy

if TYPE_CHECKING:
    from bench.plan.runs import RunSpec
    from bench.run.forecast import Prediction

COMMANDS = ("run", "setup", "list", "report", "make-dataset", "prepare-data", "new-runner",
            "schema", "status", "compare", "predict", "check-model")


DESCRIPTION = ("How fast a model trains on 1..N devices, in each framework and strategy: a "
               "YAML sweep of runners x models x device counts x batch sizes x data x "
               "precision, every run its own process; records, summary, charts, report.html.")
# the run options a first user needs; `run --help` has the rest
COMMON_OPTIONS = ("--config", "--set", "--dry-run", "--out", "--resume")


def overview(parser: argparse.ArgumentParser) -> str:
    """`run_bench.py --help`: the common run options and every command, one line each, read
    from the parser itself so the two never disagree."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    options = [a for a in run._actions if set(a.option_strings) & set(COMMON_OPTIONS)]
    rest = [a.option_strings[0] for a in run._actions
            if a.option_strings and a not in options and a.dest != "help"]
    names = [f"{a.option_strings[0]} {a.metavar or ''}".rstrip() for a in options]
    width = max(len(n) for n in [*names, *sub.choices]) + 2
    lines = ["usage: run_bench.py --config FILE [--set KEY=VALUE ...] [--dry-run] [--out DIR] "
             "[--resume]",
             "       run_bench.py COMMAND ...     (run_bench.py COMMAND --help: its options)",
             "", *textwrap.wrap(DESCRIPTION, 96), "",
             "common options (of run, the default command):"]
    lines += [f"  {n.ljust(width)}{a.help}" for n, a in zip(names, options, strict=True)]
    lines += [*textwrap.wrap(f"(run_bench.py run --help: also {', '.join(rest)})", 98,
                             initial_indent="  ", subsequent_indent="   "), "", "commands:"]
    lines += [f"  {name.ljust(width)}{c.help}"
              for name, c in ((a.dest, a) for a in sub._choices_actions)]
    lines += ["", "first sweep: python run_bench.py --config configs/cpu-smoke.yaml (README.md)",
              "every config key: docs/CONFIG.md; every command in full: docs/USAGE.md"]
    return "\n".join(lines) + "\n"


# Each command: its one line in the overview (help) and its own --help's description.
COMMANDS: dict[str, tuple[str, str | None]] = {
    "run": ("run a sweep (the default command)",
            "Run a sweep: every run its own process; records, summary, charts and report.html "
            "in the results folder."),
    "setup": ("build framework environments from their locks",
              "Build framework environments from their locks (idempotent; a sweep builds what "
              "it needs anyway)."),
    "list": ("runners (with their options), models, families; what is ready", None),
    "report": ("write a folder's summary, charts, report.html again",
               "Re-read a results folder's records and write summary.csv, the charts, "
               "report.html and results.md."),
    "make-dataset": ("write a demo or labelled dataset (no download)",
                     "Write a synthetic dataset of real JPEGs (OUT/<class>/<image>.jpg), or a "
                     "labelled one with a held-out split for mode converge (--source digits | "
                     "cifar10)"),
    "prepare-data": ("JPEG class folders -> every runner's format",
                     "JPEG class folders -> MXNet RecordIO, TFRecord shards and a JPEG file "
                     "list, all holding the same re-encoded bytes"),
    "compare": ("judge sweep NEW against BASE; exit 1 on a regression",
                "NEW against BASE, configuration by configuration: images/sec ratio with its "
                "interval (the range with 2 repeats a side, else a 95% bootstrap CI); exit 1 "
                "on a significant regression"),
    "predict": ("scaling at N devices from the 1-device step and a bandwidth",
                "Step time, images/sec and scaling efficiency at N devices from the 1-device "
                "step, the gradient bytes and a bus bandwidth (ring all-reduce)"),
    "status": ("a SLURM sweep: collect ended jobs, show the rest",
               "A SLURM sweep's jobs: collect those that ended (their records), show the "
               "others' states"),
    "schema": ("print the sweep config's JSON Schema (editor completion)",
               "Print the JSON Schema of a sweep config (for editors: run_bench.py schema > "
               "sweep.schema.json)"),
    "check-model": ("build your own models once: params, FLOPs",
                    "Build each of your own models (a models: mapping) once in its framework: "
                    "parameters, FLOPs per sample, output shape"),
    "new-runner": ("start a runner from its family's template",
                   "A new runner from its family's template, listed in the family's catalog "
                   "(docs/DESIGN.md)"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_bench.py", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    parsers = {name: sub.add_parser(name, help=help_, description=description)
               for name, (help_, description) in COMMANDS.items()}
    for add in (_run_arguments, _setup_report_arguments, _data_arguments,
                _compare_predict_arguments, _tool_arguments):
        add(parsers)
    return p


def _run_arguments(parsers: dict[str, argparse.ArgumentParser]) -> None:
    run = parsers["run"]
    run.add_argument("--config", required=True, metavar="FILE",
                     help="YAML sweep file (a first one: configs/cpu-smoke.yaml)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key; value parsed as YAML; dots reach nested keys")
    _flags(run, dry_run="print the planned runs with what each will do here, and exit")
    run.add_argument("--out", metavar="DIR",
                     help="results folder (default results/<name>-<timestamp>)")
    _flags(run,
           resume="run only what has no good record (default folder: the newest "
                  "results/<name>-*)",
           new_fingerprint="with --resume, when the settings differ from the folder's (its "
                           "fingerprint.json: every setting that changes a figure; the matrix "
                           "(runners, devices, batch sizes...) may only grow): take the new "
                           "ones; the earlier results move to DIR/superseded/<time>/ (kept, "
                           "never reported with the new ones) and every run runs again. "
                           "Without it such a resume exits 2 naming each changed setting",
           retry_failed="with --resume, run failed, timed-out and OOM runs again",
           quiet_setup="hide pip's output",
           detach="cluster.backend slurm: submit the jobs and exit (collect them with "
                  "`run_bench.py status DIR` or --resume)")
    run.add_argument("--baseline", metavar="DIR",
                     help="after the sweep, judge it against this results folder (compare's "
                          "rules); exit 4 on a significant regression; a missing or unmatched "
                          "baseline passes with a note (docs/CI.md)")
    run.add_argument("--threshold", type=float, default=0.05,
                     help="with --baseline: the smallest slowdown that counts (default 0.05)")
    run.add_argument("--fail-on", metavar="STATUSES", default=",".join(FAIL_ON_DEFAULT),
                     help="exit 3 when any run ends with one of these statuses (comma-"
                          f"separated: {', '.join(FAIL_ON_CHOICES)}; or none); default "
                          f"{','.join(FAIL_ON_DEFAULT)} (docs/CI.md)")


def _flags(parser: argparse.ArgumentParser, **helps: str) -> None:
    """One on/off option (store_true) per keyword: --word-word from word_word, with its help."""
    for name, help_ in helps.items():
        parser.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=help_)


def _setup_report_arguments(parsers: dict[str, argparse.ArgumentParser]) -> None:
    setup = parsers["setup"]
    setup.add_argument("families", nargs="*", help=f"default: all ({', '.join(FAMILIES)})")
    setup.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                       help="which variant (auto: gpu if NVML sees a GPU)")
    report = parsers["report"]
    report.add_argument("results_dir")


def _data_arguments(parsers: dict[str, argparse.ArgumentParser]) -> None:
    make = parsers["make-dataset"]
    make.add_argument("--out", required=True, help="new or empty folder to write")
    make.add_argument("--source", choices=SOURCES, default="synthetic",
                      help="synthetic (generated JPEGs; needs --classes, --images, --size), "
                           "digits (scikit-learn's bundled handwritten digits) or cifar10 "
                           "(--from your CIFAR-10 python archive); digits and cifar10 write a "
                           "prepared folder with a training and held-out split (splits.npz)")
    make.add_argument("--from", dest="from_file", metavar="FILE",
                      help="--source cifar10: cifar-10-python.tar.gz (or the folder "
                           "cifar-10-batches-py) you already have; nothing is downloaded")
    make.add_argument("--classes", type=int, metavar="K",
                      help="synthetic: number of classes (sub-folders class_000, ...), >= 1")
    make.add_argument("--images", type=int, metavar="N",
                      help="synthetic: images in total, spread evenly over the classes (the "
                           "first N mod K classes get one more), >= K")
    make.add_argument("--size", type=int, metavar="S",
                      help="synthetic: S x S RGB pixels, 8..4096")
    make.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default 0)")
    make.add_argument("--quality", type=int, default=90, help="JPEG quality 1..95 (default 90)")
    prep = parsers["prepare-data"]
    prep.add_argument("--src", required=True, help="folder with one sub-folder of JPEGs per class")
    prep.add_argument("--out", required=True, help="new or empty folder to write")
    prep.add_argument("--resize", type=int, default=256, metavar="S",
                      help="shorter side in pixels, aspect kept; 0 keeps the size (default 256)")
    prep.add_argument("--quality", type=int, default=95,
                      help="JPEG quality 1..95 of the re-encoded images (default 95)")
    prep.add_argument("--shards", type=int, default=4, help="TFRecord shards (default 4)")
    prep.add_argument("--workers", type=int, default=2,
                      help="processes that decode, resize and encode (default 2)")


def _compare_predict_arguments(parsers: dict[str, argparse.ArgumentParser]) -> None:
    compare = parsers["compare"]
    compare.add_argument("base", help="results folder of the baseline sweep")
    compare.add_argument("new", help="results folder of the sweep to judge")
    compare.add_argument("--threshold", type=float, default=0.05,
                         help="a change is significant when its interval excludes "
                              "1 +- threshold (default 0.05)")
    compare.add_argument("--out", help="folder for compare.md and the chart (default: NEW)")
    predict = parsers["predict"]
    predict.add_argument("results_dir", help="results folder with 1-device runs")
    predict.add_argument("--devices", default="2,4,8",
                         help="device counts to predict, comma-separated (default 2,4,8)")
    link = predict.add_mutually_exclusive_group()
    link.add_argument("--busbw", type=float, metavar="GB/s",
                      help="bus bandwidth in GB/s (default: the folder's allreduce probe)")
    link.add_argument("--interconnect", metavar="NAME",
                      help="a named interconnect's nominal bandwidth "
                           "(bench/analysis/interconnects.py)")
    _flags(predict, strategies="each strategy's communication per step (DDP, ZeRO-1/2/3, FSDP2, "
                               "JAX FSDP, ...) on the folder's probed collectives, and which "
                               "should win (bench/analysis/strategies.py)")
    predict.add_argument("--model", help="with --strategies: the model whose parameters "
                                         "are moved (default: the probe records' model)")
    predict.add_argument("--precision", default="fp32",
                         help="with --strategies: the harness precision policy whose reduce "
                              "and parameter dtypes set the bytes (default fp32)")


def _tool_arguments(parsers: dict[str, argparse.ArgumentParser]) -> None:
    status = parsers["status"]
    status.add_argument("results_dir")
    check = parsers["check-model"]
    check.add_argument("config", help="YAML sweep file")
    new = parsers["new-runner"]
    new.add_argument("name", help="the runner's name, as configs will say it")
    new.add_argument("family", help="its template (runners/templates/): tf, torch, mxnet, "
                                    "jax, or keras (Keras 3, in the jax environment)")
    new.add_argument("--description", default="", help="one line for `list`")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if isinstance(args, int):
        return args
    return run_command(args)


def parse(argv: list[str] | None = None) -> argparse.Namespace | int:
    """The command line's arguments (`run` implied before an option), or the exit code of
    --help or of a first word that is no command (already said)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(overview(_parser()), end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        if not argv[0].startswith("-"):  # `run` is implied only before its options
            print(f"error: {not_a_command(argv[0])}", file=sys.stderr)
            return 2
        argv.insert(0, "run")
    return _parser().parse_args(argv)


def run_command(args: argparse.Namespace) -> int:
    """The parsed command run; its bad input, a SLURM or write failure, a Ctrl-C: one line."""
    try:
        return _dispatch(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout's reader went away (`| head`): entry ends quietly
        raise
    except OSError as exc:  # a folder this user cannot write, a full disk: one line, no trace
        print(f"error: {exc.filename or 'a file'}: {exc.strerror or exc}; nothing half-written "
              f"is left (every file is written whole or not at all); {write_remedy(exc)}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a SlurmError (bench.run.slurm, imported by the commands using it)
        slurm = sys.modules.get("bench.run.slurm")
        if slurm is None or not isinstance(exc, slurm.SlurmError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "setup":
        return cmd_setup(args)
    if args.command == "list":
        return cmd_list()
    if args.command == "report":
        return cmd_report(Path(args.results_dir))
    if args.command == "run":
        return cmd_run(args)
    if args.command == "make-dataset":
        return cmd_make_dataset(args)
    if args.command == "prepare-data":
        return cmd_prepare_data(args)
    if args.command == "schema":
        from bench.plan.config import json_schema

        print(json.dumps(json_schema(), indent=2))
        return 0
    if args.command == "new-runner":
        return cmd_new_runner(args)
    if args.command == "check-model":
        return cmd_check_model(Path(args.config))
    if args.command == "status":
        return cmd_status(Path(args.results_dir))
    if args.command == "compare":
        from bench.analysis.compare import cmd_compare
        return cmd_compare(args)
    if args.command == "predict":
        from bench.analysis.predict import cmd_predict
        check_predict_devices(args.devices)
        return cmd_predict(args)
    _parser().print_help()
    return 2


def not_a_command(word: str) -> str:
    """The line for a first word that is no command, naming the closest one."""
    from bench.plan.config import show_value

    close = difflib.get_close_matches(word, COMMANDS, n=1)
    if word.endswith((".yaml", ".yml")) or Path(word).is_file():  # a sweep file without --config
        close = [f"--config {word}"]
    return (f"{show_value(word)} is not a command; allowed: {', '.join(COMMANDS)}"
            f"{f' (did you mean {close[0]}?)' if close else ''}")


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def _default_stop_signals() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def entry(argv: list[str] | None = None) -> None:
    """The process's whole life as a command: main, then an exit no late signal can break.

    Once main returns everything is written (each file whole), so stop signals are ignored
    and the process leaves without the interpreter's finalization: there, a Ctrl-C met a
    handler with no thread state (a fatal error, SIGABRT) or a handler restored by an
    interrupted context's clean-up (death by SIGINT instead of exit 130)."""
    code: object = 130
    try:
        try:
            code = _started(argv)
        except BrokenPipeError:  # output piped into `head` and closed early: not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            code = 0
        except SystemExit as exc:  # argparse's exits (--help, a usage error) keep their code
            code = exc.code
        finally:
            _ignore_stop_signals()
    except KeyboardInterrupt:
        _ignore_stop_signals()
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code or 0)


# the modules each command imports (inside its functions, so that --help, a usage error and
# the light commands start fast), imported by entry before the command's own stop handling
COMMAND_MODULES = {
    "run": ("bench.analysis.compare", "bench.analysis.converge", "bench.analysis.gate",
            "bench.plan.config", "bench.plan.runs", "bench.records.grouping",
            "bench.records.store", "bench.report.allreduce", "bench.report.capacity",
            "bench.report.converge", "bench.report.strategies", "bench.report.summary",
            "bench.run.capacity", "bench.run.forecast", "bench.run.sweep"),
    "report": ("bench.analysis.converge", "bench.analysis.explain", "bench.records.store",
               "bench.report.allreduce", "bench.report.capacity", "bench.report.converge",
               "bench.report.strategies", "bench.report.summary"),
    "setup": ("bench.run.environment", "bench.run.envs"),
    "list": ("bench.run.environment", "bench.run.envs", "models"),
    "status": ("bench.plan.config", "bench.plan.runs", "bench.records.store",
               "bench.report.summary", "bench.run.slurm"),
    "schema": ("bench.plan.config",),
    "check-model": ("bench.plan.config", "bench.run.check_model", "bench.run.environment"),
    "make-dataset": ("bench.plan.config", "bench.data.datasets", "bench.data.labelled"),
    "prepare-data": ("bench.data.prepare",),
    "compare": ("bench.analysis.compare",),
    "predict": ("bench.analysis.predict", "bench.plan.config"),
    "new-runner": ("bench.catalog.new_runner",),
}


def _started(argv: list[str] | None) -> int:
    """main as a process runs it: the command's modules imported while run_bench.py's quiet
    exit on a stop signal holds (nothing is written yet), then the command's own handling."""
    args = parse(argv)
    if isinstance(args, int):
        return args
    for name in COMMAND_MODULES.get(args.command, ()):
        importlib.import_module(name)
    _default_stop_signals()  # run_bench.py's quiet exit while importing ends here
    return run_command(args)


def default_variant() -> str:
    from bench.run import environment

    return "gpu" if environment.gpus() else "cpu"


def cmd_setup(args: argparse.Namespace) -> int:
    from bench.run.envs import EnvError, ensure_env

    variant = default_variant() if args.device == "auto" else args.device
    for fam in args.families:
        if fam not in FAMILIES:
            raise ConfigError(f"setup: family {fam!r} is not allowed; allowed: "
                              f"{', '.join(FAMILIES)}")
    failed = 0
    for fam in args.families or list(FAMILIES):
        try:
            env = ensure_env(fam, variant, retry=True)
            print(f"{fam}-{variant}: ready at {env.path}")
        except EnvError as exc:
            print(f"{fam}-{variant}: FAILED: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def cmd_list() -> int:
    from bench.run.envs import family_env
    from models import available_models, get_spec

    variant = default_variant()
    print(f"Families ({variant} variant; environments in {family_env('tf', variant).path.parent}):")
    for fam in FAMILIES.values():
        env = family_env(fam.name, variant)
        state = "ready" if env.ready else "not set up (run_bench.py setup " + fam.name + ")"
        print(f"  {fam.name:<14} {state:<40} {fam.description}")
    print("\nRunners:")
    for r in RUNNERS.values():
        needs = launch_problem(r)
        state = ("unavailable" if r.unavailable else "needs setup" if needs else
                 "ready" if family_env(r.family, variant).ready else "not ready")
        print(f"  {r.name:<24} family={r.family:<6} {state:<11} {r.description}")
        if r.unavailable:
            print(f"      unavailable: {r.unavailable}")
        if needs:
            print(f"      before it runs: {needs}")
        nodes = (f"{r.multi_node} (unavailable here: {r.multi_node_unavailable})"
                 if r.multi_node and r.multi_node_unavailable else
                 r.multi_node or "one machine only (single-machine by design)")
        print(f"      across nodes: {nodes}")
        for name, opt in r.options.items():
            allowed = f" ({' | '.join(map(str, opt.allowed))})" if opt.allowed else ""
            gpu = f" [gpu: {opt.gpu_default!r}]" if opt.has_gpu_default else ""
            print(f"      {name}={opt.default!r}{gpu}{allowed}  {opt.help}")
    print("\nInput pipelines (mode: pipeline):")
    for p in PIPELINES.values():
        state = ("ready" if p.family == "harness" or family_env(p.family, variant).ready
                 else "not ready")
        print(f"  {p.name:<24} family={p.family:<7} {state:<10} {p.description}")
    print("\nAll-reduce probes (mode: allreduce; buffers from 1 MiB to the model's gradient "
          "size):")
    for p in PROBES.values():
        state = "ready" if family_env(p.family, variant).ready else "not ready"
        print(f"  {p.name:<24} family={p.family:<7} {state:<10} {p.description}")
        print(f"      launcher: {p.launcher}")
    print("\nModels:")
    for name in available_models():
        s = get_spec(name)
        shape = ("tokens " if s.input_kind == "tokens" else "") + "x".join(map(str,
                                                                             s.input_shape))
        outputs = f"{'vocab' if s.input_kind == 'tokens' else 'classes'}={s.num_classes}"
        print(f"  {name:<16} {s.workload:<12} input={shape:<12} {outputs:<14} "
              f"params={s.params:,}  GFLOPs/sample={s.flops_per_sample / 1e9:.3f}")
    print("  (your own model: a models: mapping in the sweep file; docs/MODELS.md)")
    return 0


def launch_problem(info: Any) -> str | None:
    """What the runner's own pre-launch check (its catalog's launch_check) says of a run with
    its default options on this host's CPU, before any model (a checkout it needs, say)."""
    if info.launch_check is None:
        return None
    spec = SimpleNamespace(runner=info.name, mode="list", device="cpu", precision="fp32",
                           model=None, num_devices=1,
                           options={k: o.default for k, o in info.options.items()})
    try:
        return info.launch_check(spec)
    except Exception:  # a check that needs a real run's spec says nothing here
        return None


def cmd_new_runner(args: argparse.Namespace) -> int:
    from bench.catalog.new_runner import new_runner

    module, catalog = new_runner(args.name, args.family, args.description)
    print(f"wrote {module.relative_to(REPO_ROOT)} and its entry in "
          f"{catalog.relative_to(REPO_ROOT)}\n"
          f"try it: python run_bench.py --config configs/cpu-smoke.yaml "
          f"--set runners=[{args.name}]\n"
          f"then make it the strategy it names: docs/DESIGN.md, \"Add a runner\"")
    return 0


def cmd_check_model(config: Path) -> int:
    from bench.plan.config import load_config
    from bench.run.check_model import check_models, describe

    cfg = load_config(config)
    checked = check_models(cfg, default_variant())
    if not checked:
        print(f"{config}: no model of your own (a models: mapping) to check")
        return 0
    bad = [answer["error"] for _, answer in checked if "error" in answer]
    for entry, answer in checked:
        if "error" not in answer:
            print(describe(entry, answer))
    for line in bad:
        print(f"error: {line}", file=sys.stderr)
    return 2 if bad else 0


def cmd_status(results_dir: Path) -> int:
    """A SLURM sweep's jobs: ended ones collected into records, the others' queue states."""
    from bench.plan.config import load_config
    from bench.plan.runs import expand
    from bench.records.store import read_environment
    from bench.report.summary import build_report
    from bench.run import slurm

    if not (results_dir / slurm.BOOK).exists():
        raise ConfigError(f"results_dir: {str(results_dir)!r} has no {slurm.BOOK}; allowed: "
                          "the results folder of a sweep with cluster.backend: slurm")
    cfg = load_config(str(results_dir / "config.yaml"), [])
    specs = {r.run_id: r for r in expand(cfg, results_dir.name)}
    env, damage = read_environment(results_dir)
    if damage is not None:  # the jobs' records then carry no host environment, said here
        print(damage.line(), file=sys.stderr)
    rows = slurm.status(results_dir, specs, env or {})
    width = max(len(r[0]) for r in rows) if rows else 0
    for run_id, job_id, state in rows:
        print(f"{run_id.ljust(width)}  job {job_id:>8}  {state}")
    counts: dict[str, int] = {}
    for *_, state in rows:
        key = state.split(" (")[0]
        counts[key] = counts.get(key, 0) + 1
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no jobs")
    if rows and all(state.startswith("recorded") for *_, state in rows):
        build_report(results_dir)
        print(f"all jobs ended; summary: {results_dir / 'summary.csv'}")
    return 0


def strategy_text(records: list[dict]) -> str | None:
    """The strategy tables of a folder's records (None without a comparison)."""
    from bench.report.strategies import format_strategies, strategy_rows

    return format_strategies(strategy_rows(records))


def converge_text(records: list[dict[str, Any]]) -> str | None:
    """Mode converge's seed-form table, or None when the folder has no converge record."""
    from bench.analysis.converge import converge_rows
    from bench.report.converge import table_lines

    return "\n".join(table_lines(converge_rows(records))) or None


def cmd_report(results_dir: Path) -> int:
    from bench.records.store import one_scan

    if not results_dir.exists():
        raise ConfigError(f"report: {str(results_dir)!r} does not exist; allowed: a results "
                          "folder written by a sweep")
    if not ((results_dir / "runs").is_dir() or (results_dir / "capacity").is_dir()):
        raise ConfigError(f"report: {str(results_dir)!r} has no runs/ folder (nor a "
                          "capacity/ one); "
                          "allowed: a results folder written by a sweep")
    with one_scan():  # the records read once for every part of the report
        return _report(results_dir)


def _report(results_dir: Path) -> int:
    from bench.analysis.explain import text as explain_text
    from bench.records.store import folder_damage, load_records
    from bench.report.allreduce import CSV_NAME, allreduce_table
    from bench.report.capacity import CSV_NAME as CAPACITY_CSV
    from bench.report.capacity import capacity_table
    from bench.report.summary import build_report, findings_text, format_table

    damaged = folder_damage(results_dir)  # one line each, never a number from them
    rows, pipes, charts = build_report(results_dir)
    records = load_records(results_dir)
    probes = allreduce_table(results_dir, records)
    searches = capacity_table(results_dir)
    print(findings_text(rows, records) + "\n\n" if rows else "", end="")
    print(format_table(rows, pipes, probes, strategy_text(records), searches,
                       converge_text(records)))
    lines = explain_text(rows, records)
    if lines:
        print("\n" + lines)
    print(f"\nsummary: {results_dir / 'summary.csv'}")
    if pipes:
        print(f"pipelines: {results_dir / 'pipelines.csv'}")
    if probes:
        print(f"allreduce: {results_dir / CSV_NAME}")
    if searches:
        print(f"capacity:  {results_dir / CAPACITY_CSV}")
    for c in charts:
        print(f"{'report' if c.suffix in ('.html', '.md') else 'chart'}:   {c}")
    for item in damaged:
        print(item.line(), file=sys.stderr)
    return 0


def cmd_make_dataset(args: argparse.Namespace) -> int:
    from bench.data.datasets import make_dataset, validate
    from bench.plan.config import show_value

    out = Path(args.out)
    if args.source != "synthetic":
        return make_labelled(args, out)
    for key in ("classes", "images", "size"):
        if getattr(args, key) is None:
            raise ConfigError(f"--{key}: missing; required with --source synthetic")
    if args.from_file:
        raise ConfigError(f"--from: {args.from_file!r} is not allowed with --source synthetic; "
                          "allowed: nothing (it is --source cifar10's)")
    validate(out, args.classes, args.images, args.size, args.quality)
    if not 0 <= args.seed < 2**63:  # numpy's seed: a non-negative integer
        raise ConfigError(f"--seed: {show_value(args.seed)} is not allowed; allowed: an "
                          "integer from 0 to 2**63 - 1")
    print(f"make-dataset: {args.images} images, {args.classes} classes, {args.size}x{args.size}, "
          f"seed {args.seed}, quality {args.quality} -> {out}", flush=True)
    manifest = make_dataset(out, args.classes, args.images, args.size, seed=args.seed,
                            quality=args.quality, log=lambda line: print(line, flush=True))
    print(f"dataset: {out}")
    print(f"total:   {manifest['total_bytes']:,} bytes in {manifest['images']} images")
    return 0


def make_labelled(args: argparse.Namespace, out: Path) -> int:
    from bench.data.labelled import write_labelled

    for key in ("classes", "images", "size"):
        if getattr(args, key) is not None:
            raise ConfigError(f"--{key}: {getattr(args, key)} is not allowed with --source "
                              f"{args.source} (its images and classes are the source's); "
                              "allowed: nothing")
    print(f"make-dataset: {args.source} -> {out}", flush=True)
    manifest = write_labelled(out, args.source, args.from_file,
                              log=lambda line: print(line, flush=True))
    splits = manifest["splits"]
    print(f"dataset: {out}")
    print(f"splits:  {splits['train']} training, {splits['heldout']} held out "
          f"({splits['how']}); {manifest['classes']} classes; {out / splits['file']}")
    return 0


def cmd_prepare_data(args: argparse.Namespace) -> int:
    from bench.data.prepare import prepare_data, validate_options

    out = Path(args.out)
    validate_options(Path(args.src), out, args.resize, args.quality, args.shards, args.workers)
    print(f"prepare-data: {args.src} -> {out} (resize {args.resize}, quality {args.quality}, "
          f"{args.shards} shards, {args.workers} workers)", flush=True)
    manifest = prepare_data(Path(args.src), out, resize=args.resize, quality=args.quality,
                            shards=args.shards, workers=args.workers,
                            log=lambda line: print(line, flush=True))
    print(f"dataset: {out}")
    print(f"total:   {manifest['images']} images, {manifest['classes']} classes, "
          f"{manifest['total_jpeg_bytes']:,} JPEG bytes; recordio train.rec, "
          f"{args.shards} tfrecord shards, files.csv")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from bench.analysis.compare import check_threshold
    from bench.plan.config import load_config, show_value
    from bench.plan.runs import expand
    from bench.run.sweep import check_fingerprint, results_folder, run_sweep

    cfg = load_config(args.config, args.set)
    check_threshold(args.threshold)
    if args.detach and cfg.cluster["backend"] != "slurm":  # before any folder is made
        raise ConfigError("--detach: allowed only with cluster.backend: slurm (a local sweep "
                          "runs in this process)")
    if args.out is not None:
        check_out(args.out)
    _resume_flags(args)  # in the dry run too: it answers as the run would
    fail_on = parse_fail_on(args.fail_on)
    out = results_folder(cfg, args.out, args.resume)
    if not args.resume:
        check_new_folder(out)
    runs = expand(cfg, out.name)
    if args.dry_run:
        if args.resume and not args.new_fingerprint:
            check_fingerprint(cfg, out, False)  # refused as the run would refuse it
        return _dry_run(args, cfg, runs, out)
    if args.out:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--out: {show_value(args.out)} cannot be made "
                              f"({exc.strerror or exc}); allowed: {OUT_WORDS}") from None
    end = run_sweep(cfg, runs, out, resume=args.resume, retry_failed=args.retry_failed,
                    detach=args.detach, quiet_setup=args.quiet_setup,
                    new_fingerprint=args.new_fingerprint)
    if end.code is not None:
        return end.code
    if end.detached:
        return 0
    return _report_sweep(out, end.signum, Judge(args.baseline, args.threshold, fail_on))


def check_new_folder(out: Path) -> None:
    """A sweep without --resume writes into a folder of its own: one that holds another
    sweep's results (its fingerprint, a record, a capacity search) is refused, naming it and
    the choices, so two configurations never mix in one summary."""
    from bench.plan.config import show_value
    from bench.records.store import record_files
    from bench.run.capacity import CAPACITY_DIR
    from bench.run.sweep import FINGERPRINT

    held = [p for p in (out / FINGERPRINT, out / CAPACITY_DIR) if p.exists()] or \
        record_files(out)[:1]
    if held:
        raise ConfigError(f"--out {show_value(str(out))}: it holds another sweep's results "
                          f"({held[0].relative_to(out)}); allowed: --resume to finish or grow "
                          "that sweep (its settings), or --out a new folder")


def _resume_flags(args: argparse.Namespace) -> None:
    """--new-fingerprint and --retry-failed mean something only with --resume: refused, not
    ignored, without it."""
    if args.new_fingerprint and not args.resume:
        raise ConfigError("--new-fingerprint: allowed only with --resume (a new sweep writes "
                          "its own fingerprint)")
    if args.retry_failed and not args.resume:
        raise ConfigError("--retry-failed: allowed only with --resume (a new sweep has no "
                          "failed runs to run again)")


def _dry_run(args: argparse.Namespace, cfg: Any, runs: list[Any], out: Path) -> int:
    """`run --dry-run`: the planned runs with what each will do here, and the forecast."""
    from bench.records.store import done_run_ids
    from bench.report.converge import recipe_line
    from bench.run import forecast

    if "capacity" in cfg.mode:
        print(f"sweep {cfg.name}: {len(runs)} capacity searches ({cfg.scale}: start "
              f"{cfg.capacity['start']}, max {cfg.capacity['max']}, resolution "
              f"{cfg.capacity['resolution']}) -> {out}; each search's first probe below, "
              "the others follow from the probes' results")
    else:
        print(f"sweep {cfg.name}: {len(runs)} runs -> {out}")
    if "converge" in cfg.mode:
        print(f"recipe: {recipe_line(cfg.converge)}")
    if cfg.until_stable:
        print(f"until_stable: more repeats of a configuration while its images/sec CV is "
              f"above {cfg.until_stable['target_cv']:.1%}, up to "
              f"{cfg.until_stable['max_repeats']} runs each")
    facts = forecast.HostFacts.here(out)
    predicted = forecast.predict(runs, cfg, facts)
    if args.resume and out.is_dir():
        done = done_run_ids(out, retry_failed=args.retry_failed)
        predicted = forecast.already_recorded(runs, predicted, done, out)
    print_plan(runs, predicted)
    for line in forecast.summary_lines(runs, predicted, cfg, facts):
        print(line)
    return 0


@dataclass(frozen=True)
class Judge:
    """How an ended sweep's exit status is decided: the baseline to compare with (None: no
    comparison), compare's threshold, and the run statuses that fail it (--fail-on)."""
    baseline: str | None = None
    threshold: float = 0.05
    fail_on: tuple[str, ...] = FAIL_ON_DEFAULT


def _report_sweep(out: Path, signum: int | None, judge: Judge = Judge()) -> int:
    """The report of an ended sweep, judged; a second Ctrl-C, or a full disk, ends it
    cleanly."""
    from bench.run.sweep import stop_signals_interrupt

    try:  # a second Ctrl-C (or a SIGTERM) during the report ends quietly: every file is whole
        with stop_signals_interrupt():
            return report_end(out, signum, judge)
    except KeyboardInterrupt as exc:
        return report_interrupted(out, signum, exc)
    except OSError as exc:  # a full disk: the records stay, no half file, no temporary
        if (interrupt := interrupted_by(exc)) is not None:
            return report_interrupted(out, signum, interrupt)
        print(f"cannot write {exc.filename or out}: {exc.strerror or exc}; the records are "
              f"kept in {out}; {write_remedy(exc)}, then `run_bench.py report {out}`",
              file=sys.stderr)
        return 1
    except Exception as exc:  # a Ctrl-C inside a C extension's import comes as ImportError
        if (interrupt := interrupted_by(exc)) is None:
            raise
        return report_interrupted(out, signum, interrupt)


def interrupted_by(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (Ctrl-C, or SIGTERM/SIGHUP as Stopped) that caused exc, if any."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def report_interrupted(out: Path, first: int | None, exc: KeyboardInterrupt) -> int:
    """A stop signal while the report was written: one line; the records and every report
    file are whole (each written through a temporary name and a rename)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # one line, whatever comes next
    now = getattr(exc, "signum", signal.SIGINT)
    print(f"\ninterrupted ({signal.Signals(now).name}) while the report was written: the "
          f"records are kept in {out}, each report file whole (old or new); "
          f"`run_bench.py report {out}` writes them again", file=sys.stderr)
    return 128 + (first or now)


def report_end(out: Path, signum: int | None, judge: Judge = Judge()) -> int:
    """The end of a sweep that ran here: judged against the baseline (where given), the
    report written and shown (after a stop signal: the line saying so, and the report
    written); the exit code: RUNS_FAILED_EXIT when a run's status is one of judge.fail_on,
    else the gate's; the last line says which decided."""
    from bench.analysis.gate import clear_gate, run_gate
    from bench.records.store import load_records, one_scan
    from bench.report.allreduce import allreduce_table
    from bench.report.capacity import capacity_table
    from bench.report.summary import build_report, findings_text, format_table

    if signum is not None:
        print(f"\ninterrupted ({signal.Signals(signum).name}): finished records are kept "
              f"in {out}; continue with --resume --out {out}", file=sys.stderr)
        build_report(out)
        return 128 + signum
    outcome = (run_gate(judge.baseline, out, judge.threshold) if judge.baseline
               else clear_gate(out))
    with one_scan():
        rows, pipes, charts = build_report(out)
        records = load_records(out)
    step_summary(out)
    print()
    print(findings_text(rows, records) + "\n\n" if rows else "", end="")
    print(format_table(rows, pipes, allreduce_table(out), strategy_text(records),
                       capacity_table(out), converge_text(records)))
    print(f"\nresults: {out}")
    print(f"summary: {out / 'summary.csv'}   charts: {out / 'charts'}   "
          f"report: {out / 'report.html'}   {out / 'results.md'}   {out / 'junit.xml'}")
    code, runs_line = runs_exit(records, judge.fail_on)
    if outcome is not None:
        print(outcome.line)
    code = code or (outcome.code if outcome is not None else 0)
    print(f"exit {code}: {runs_line}" + (f"; baseline: {outcome.status}" if outcome else ""))
    if line := timeout_next_step(records, out):
        print(line)
    return code


def timeout_next_step(records: list[dict[str, Any]], out: Path) -> str | None:
    """The command that runs the timed-out runs again with twice their time, or None."""
    timed_out = [r for r in records if r.get("status") == "timeout"]
    if not timed_out:
        return None
    # the limit each ran under, as its reason says it (launch: "exceeded timeout_s=N; ...")
    given = [float(m.group(1)) for r in timed_out
             if (m := re.search(r"timeout_s=([0-9.]+)", str(r.get("reason"))))]
    if not given:
        return None
    limit = 2 * max(given)
    return (f"next: {len(timed_out)} run(s) timed out; run them again with more time: "
            f"python run_bench.py --config {shlex.quote(str(out / 'config.yaml'))} --out "
            f"{shlex.quote(str(out))} --resume --retry-failed --set timeout_s={limit:g}")


def step_summary(out: Path) -> None:
    """results.md appended to $GITHUB_STEP_SUMMARY, where a GitHub Actions step set it."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write((out / "results.md").read_text(encoding="utf-8") + "\n")
    except OSError as exc:
        print(f"note: GITHUB_STEP_SUMMARY {target}: cannot append ({exc.strerror or exc})",
              file=sys.stderr)


OUT_WORDS = "a folder this user can make or write in (new, or a sweep's results folder)"


def check_out(text: str) -> None:
    """--out, before anything runs or is made (in the dry run too): each name within the
    filesystem's 255 bytes, not a file nor under one, and writable (or its nearest existing
    folder, where it is to be made); a ConfigError naming --out otherwise."""
    from bench.plan.config import show_value
    from bench.run.sweep import NAME_MAX

    shown = show_value(text)
    if not text.strip():
        raise ConfigError(f"--out: {shown} is not allowed: an empty path; allowed: {OUT_WORDS}")
    path = Path(os.path.abspath(text))
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ConfigError(f"--out: {shown} is not allowed: a name in it is "
                              f"{len(os.fsencode(part))} bytes; allowed: {OUT_WORDS}, each "
                              f"name at most {NAME_MAX} bytes")
    there = path
    while not os.path.lexists(there) and there != there.parent:
        there = there.parent
    where = "it" if there == path else f"{str(there)!r}"
    if not there.is_dir():
        raise ConfigError(f"--out: {shown} is not allowed: {where} is "
                          f"{'a file' if there.exists() else 'a broken link'}; "
                          f"allowed: {OUT_WORDS}")
    if not os.access(there, os.W_OK | os.X_OK) or not _can_make_in(there):
        raise ConfigError(f"--out: {shown} is not allowed: {where} is not writable by this "
                          f"user; allowed: {OUT_WORDS}")


def _can_make_in(folder: Path) -> bool:
    """Whether a folder can be made in `folder`, tried (and removed at once): access() says
    yes to root anywhere, /proc and read-only mounts included."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mgbench-out-", dir=folder))
    except OSError:
        return False
    return True


PREDICT_MAX_DEVICES = 1_000_000  # a device count predict takes (one past 64 bits broke numpy)
PREDICT_MAX_COUNTS = 64  # device counts in one --devices


def check_predict_devices(text: str) -> None:
    """predict --devices, before it is parsed: each count ASCII digits from 1 to
    PREDICT_MAX_DEVICES, at most PREDICT_MAX_COUNTS of them (parse_devices refuses a count
    given twice); a one-line ConfigError otherwise."""
    from bench.plan.config import show_value

    allowed = (f"comma-separated device counts, integers from 1 to {PREDICT_MAX_DEVICES} "
               "(e.g. 2,4,8)")
    parts = str(text).split(",")
    if len(parts) > PREDICT_MAX_COUNTS:
        raise ConfigError(f"devices: {show_value(text)} ({len(parts)} counts) is not allowed; "
                          f"allowed: {allowed}, at most {PREDICT_MAX_COUNTS} of them")
    for part in (p.strip() for p in parts):
        if not re.fullmatch(r"[0-9]{1,7}", part) or not 1 <= int(part) <= PREDICT_MAX_DEVICES:
            raise ConfigError(f"devices: {show_value(part)} (in {show_value(text)}) is not "
                              f"allowed; allowed: {allowed}")


def print_plan(runs: list[RunSpec], predicted: list[Prediction]) -> None:
    """The plan's table, each run's predicted status (bench/run/forecast.py) in its last
    column; the reasons follow it (forecast.summary_lines)."""
    from bench.records.grouping import runner_label

    head = ("#", "run_id", "runner", "model", "devices", "per-dev", "global", "prec", "data",
            "predicted")
    rows = [head] + [
        (str(i), r.run_id, runner_label(r), r.model,
         (f"{r.num_nodes}x{r.devices_per_node}" if r.num_nodes > 1 else str(r.num_devices))
         + f" {'vcpu' if r.virtual_devices else r.device}",
         *((str(r.batch_size_per_device), str(r.global_batch_size), r.precision, r.data_label)
           if r.mode != "allreduce" else ("-", "-", "fp32", "buffers")), p.status)
        for i, (r, p) in enumerate(zip(runs, predicted, strict=True), 1)
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for j, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))
