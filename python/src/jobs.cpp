// The jobs from Python: normlab._normlab.jobs holds train, stability and sample as calls of the
// library's jobs (jobs/train.h, jobs/stability.h, jobs/sample.h), the train job a step at a time
// (TrainSession), train checkpoints (Checkpoint, save_checkpoint) and the model they hold (Model).
// python/normlab/_jobs.py is the public face: it turns configs into JSON text, results into NumPy
// arrays and dataclasses, and draws the progress lines.
//
// The GIL is released while a job runs; each callback takes it back to call Python. After every
// train step the job checks Python's signals (PyErr_CheckSignals): a KeyboardInterrupt (Ctrl-C)
// stops the run after that step with a checkpoint, as stop_after does, and is raised again once
// the job has returned, so the run directory is valid and resume continues it. A KeyboardInterrupt
// raised by a callback does the same. Any other exception a callback raises ends the job: the run
// directory gets error.txt and the exception reaches the caller unchanged. The job's own errors are
// normlab.Error (nl::Error) with the C++ message.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fmt/core.h>

#include "bindings.h"
#include "core/dist.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "jobs/analyze.h"
#include "jobs/config_schema.h"
#include "jobs/convert.h"
#include "jobs/export.h"
#include "jobs/run_dir.h"
#include "jobs/sample.h"
#include "jobs/stability.h"
#include "jobs/sweep.h"
#include "jobs/train.h"
#include "layers/checkpoint.h"

namespace nl::py {

namespace {

// ---- JSON <-> Python ----

// A JSON value as Python objects. A non-finite number becomes None, as the JSON files hold it; with
// keep_nonfinite (a job's result, converted from its struct, never written), it stays a float NaN or inf.
nb::object to_python(const nlohmann::json& value, bool keep_nonfinite = false) {
    switch (value.type()) {
        case nlohmann::json::value_t::null: return nb::none();
        case nlohmann::json::value_t::boolean: return nb::bool_(value.get<bool>());
        case nlohmann::json::value_t::number_integer: return nb::int_(value.get<int64_t>());
        case nlohmann::json::value_t::number_unsigned: return nb::int_(value.get<uint64_t>());
        case nlohmann::json::value_t::number_float: {
            const double x = value.get<double>();
            return std::isfinite(x) || keep_nonfinite ? nb::object(nb::float_(x)) : nb::object(nb::none());
        }
        case nlohmann::json::value_t::string: return nb::str(value.get_ref<const std::string&>().c_str());
        case nlohmann::json::value_t::array: {
            nb::list items;
            for (const nlohmann::json& item : value) items.append(to_python(item, keep_nonfinite));
            return items;
        }
        case nlohmann::json::value_t::object: {
            nb::dict items;
            for (const auto& [key, item] : value.items()) items[nb::str(key.c_str())] = to_python(item, keep_nonfinite);
            return items;
        }
        default: return nb::none();  // binary and discarded values do not occur in configs
    }
}

// A job's result (or progress event) struct as a dict, through the fields its header declares next to
// it (NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE or a *_json function): the one list of them. Its summary
// stays as summary.json holds it (non-finite numbers as None).
nb::dict result_to_python(const nlohmann::json& result) {
    nb::dict d;
    for (const auto& [key, item] : result.items())
        d[nb::str(key.c_str())] = key == "summary" ? to_python(item) : to_python(item, true);
    return d;
}

// ---- what Python passes for a job's config ----

// The config as _jobs.py passes it: a file path, or JSON text of a dict (parsed here with the depth
// limit, so a bad dict is an nl::Error naming `name`).
struct ConfigArg {
    std::string path;
    std::string json_text;
    std::string name = "config";
};

template <typename Job>
void set_config(Job& job, const ConfigArg& config) {
    job.config_path = config.path;
    job.config_name = config.name;
    if (config.path.empty()) job.config = parse_json(config.json_text, config.name);
}

// ---- errors raised in callbacks ----

// Thrown through a job when a callback's Python code raised: the job unwinds (the stability job
// writes error.txt with this message) and the caller raises the Python exception again.
class CallbackError : public std::exception {
public:
    explicit CallbackError(std::string message) : message_(std::move(message)) {}
    const char* what() const noexcept override { return message_.c_str(); }

private:
    std::string message_;
};

// "ValueError: boom" for a Python exception (the GIL held).
std::string describe_python_error(const nb::python_error& e) {
    try {
        return fmt::format("{}: {}", nb::type_name(e.type()).c_str(), nb::str(e.value()).c_str());
    } catch (...) {
        return "an exception that cannot be printed";
    }
}

// What a job's callbacks share: the Python exception to raise once the job has returned. Lives
// outside the GIL-released scope, so the exceptions are released with the GIL held.
struct CallbackState {
    std::optional<nb::python_error> interrupt;  // a KeyboardInterrupt: the job stops between steps
    std::optional<nb::python_error> failure;    // anything else: the job failed

    // Files a Python exception (caught with the GIL held). A KeyboardInterrupt returns true: the job
    // is to stop at the next step boundary; anything else returns false (the caller throws).
    bool take(nb::python_error&& e) {
        if (e.matches(PyExc_KeyboardInterrupt)) {
            if (!interrupt) interrupt.emplace(std::move(e));
            return true;
        }
        failure.emplace(std::move(e));
        return false;
    }

    // After the job returned or threw CallbackError (the GIL held): raises the filed exception.
    void raise() {
        if (failure) throw nb::python_error(std::move(*failure));
        if (interrupt) throw nb::python_error(std::move(*interrupt));
    }

    // For the jobs made of runs (stability, sweep): a callback's Python error, KeyboardInterrupt
    // included, cancels the job. Files it and throws CallbackError "<job>: <where> raised <error>".
    [[noreturn]] void cancel(nb::python_error&& e, const char* job, const std::string& where) {
        const bool interrupted = take(std::move(e));
        throw CallbackError(
            fmt::format("{}: {} raised {}", job, where, describe_python_error(interrupted ? *interrupt : *failure)));
    }

    // Calls a Python callback with `arg` (the GIL held); its exception cancels the job as above.
    void call(const nb::object& callback, const nb::dict& arg, const char* job, const std::string& where) {
        try {
            callback(arg);
        } catch (nb::python_error& e) {
            cancel(std::move(e), job, where);
        }
    }
};

// Runs `job` (a function running a job with these callbacks) with the GIL released; when a callback
// cancelled it, raises the callback's Python exception.
template <typename Run>
auto run_without_gil(CallbackState& state, Run run) {
    std::optional<decltype(run())> result;
    try {
        nb::gil_scoped_release release;
        result = run();
    } catch (const CallbackError&) {
        state.raise();
        throw;
    }
    return std::move(*result);
}

// ---- the train job ----

// One step as a dict with metrics.csv's columns (the val_* keys NaN when the step did not evaluate),
// plus steps, evaluated, threads, max_threads and world_size.
nb::dict step_dict(const TrainStep& t) {
    nb::dict d;
    for (const MetricsCell& cell : metrics_row(t)) d[cell.column.c_str()] = cell.value.value_or(NAN);
    d["step"] = t.step;  // an int, as in the CSV
    d["steps"] = t.steps;
    d["evaluated"] = t.evaluated;
    d["threads"] = t.threads;
    d["max_threads"] = t.max_threads;
    d["world_size"] = t.world_size;
    nb::dict probes;  // probes.csv's row on a probed step (train.probe_every), else empty
    for (const auto& [name, value] : t.probes) probes[nb::str(name.c_str())] = value;
    d["probes"] = probes;
    return d;
}

nb::dict eval_dict(const EvalResult& e) {
    nb::dict d;
    d["val_loss"] = e.loss;
    d["val_accuracy"] = e.accuracy;
    d["val_token_accuracy"] = e.token_accuracy;
    return d;
}

// The result as a dict: run_dir, complete, last_step, summary (None when stopped early), steps (a
// list of step dicts, in order), profile (the table, "" without profile).
nb::dict result_dict(const TrainResult& r) {
    nb::dict d;
    d["run_dir"] = r.run_dir;
    d["complete"] = r.complete;
    d["last_step"] = r.last_step;
    d["summary"] = to_python(r.summary);
    nb::list steps;
    for (const TrainStep& t : r.history) steps.append(step_dict(t));
    d["steps"] = steps;
    d["profile"] = r.profile_table;
    return d;
}

TrainJob train_job(const ConfigArg& config, const std::vector<std::string>& overrides, const std::string& out,
                   bool force, bool resume, int64_t stop_after, bool profile) {
    // The same checks as `normlab train`'s flags, in the keyword arguments' names.
    NL_REQUIRE(!resume || !out.empty(), "train: resume=True needs out= naming the run directory");
    NL_REQUIRE(!(resume && force), "train: resume=True and force=True cannot be combined");
    NL_REQUIRE(stop_after >= 0, "train: stop_after must be >= 0, found ", stop_after);
    TrainJob job;
    set_config(job, config);
    job.overrides = overrides;
    job.out = out;
    job.force = force;
    job.resume = resume;
    job.stop_after = stop_after;
    job.profile = profile;
    return job;
}

// The metadata a train checkpoint of this session's model carries (as the job writes it).
std::map<std::string, std::string> session_metadata(const TrainSession& session) {
    std::map<std::string, std::string> metadata = {
        {"config", session.config().resolved.dump()},
        {kTrainedSeqLenKey, std::to_string(session.dataset().seq_len())}};
    const nlohmann::json vocab = session.dataset().vocab_metadata();
    if (!vocab.is_null()) metadata["vocab"] = vocab.dump();
    return metadata;
}

// error.txt in the run directory (rank 0), marking the run failed; summary.json cannot exist yet.
void mark_failed(const std::string& run_dir, const std::string& message) {
    if (run_dir.empty() || !dist::is_root()) return;
    try {
        write_file_atomic(run_dir + "/error.txt", message + "\n");
    } catch (...) {
        // a full disk: the caller still gets the callback's exception, which matters more
    }
}

nb::dict train(const ConfigArg& config, const std::vector<std::string>& overrides, const std::string& out,
               bool force, bool resume, int64_t stop_after, bool profile, nb::object on_start, nb::object on_step) {
    const TrainJob job = train_job(config, overrides, out, force, resume, stop_after, profile);
    CallbackState state;
    std::string run_dir;
    int64_t step = 0;  // the latest step, for messages
    TrainCallbacks callbacks;
    // A callback's Python error: a KeyboardInterrupt stops the run after this step; another ends it.
    auto fail = [&](nb::python_error&& e, const char* where) {
        if (state.take(std::move(e))) return;
        const std::string message =
            fmt::format("train: the {} callback raised {} (at step {})", where, describe_python_error(*state.failure), step);
        mark_failed(run_dir, message);
        throw CallbackError(message);
    };
    callbacks.on_start = [&](const TrainSession& session) {
        nb::gil_scoped_acquire gil;
        run_dir = session.run_dir();
        step = session.step();
        if (on_start.is_none()) return;
        nb::dict info;
        info["description"] = session.description();
        info["run_dir"] = session.run_dir();
        info["start_step"] = session.step();
        info["end_step"] = session.end_step();
        info["steps"] = session.config().train.steps;
        info["log_every"] = session.config().train.log_every;
        try {
            on_start(info);
        } catch (nb::python_error& e) {
            fail(std::move(e), "start");
        }
    };
    callbacks.on_step = [&](const TrainStep& t) {
        step = t.step;
        if (on_step.is_none()) return;
        nb::gil_scoped_acquire gil;
        try {
            on_step(step_dict(t));
        } catch (nb::python_error& e) {
            fail(std::move(e), "progress");
        }
    };
    callbacks.should_stop = [&] {
        nb::gil_scoped_acquire gil;
        if (!state.interrupt && PyErr_CheckSignals() != 0) fail(nb::python_error(), "signal handler");
        return state.interrupt.has_value();
    };
    const TrainResult result = run_without_gil(state, [&] { return run_train(job, callbacks); });
    state.raise();  // a KeyboardInterrupt: the run stopped with a checkpoint
    return result_dict(result);
}

// The train job a step at a time (Python's TrainSession). The session is shared with the models
// taken from it, so a model outlives a session object that Python dropped.
class PySession {
public:
    PySession(const std::string& config_path, const std::string& config_json, const std::string& config_name,
              const std::vector<std::string>& overrides, const std::string& out, bool force, bool resume,
              int64_t stop_after, bool profile) {
        const TrainJob job = train_job({config_path, config_json, config_name}, overrides, out, force, resume,
                                       stop_after, profile);
        nb::gil_scoped_release release;
        session_ = std::make_shared<TrainSession>(job);
    }

    TrainSession& session() {
        NL_REQUIRE(session_, "TrainSession: the session was closed");
        return *session_;
    }
    std::shared_ptr<TrainSession> shared() {
        session();
        return session_;
    }

    // Runs `f` on the session with the GIL released; one call at a time.
    template <typename F>
    auto run(F&& f) {
        TrainSession& s = session();
        NL_REQUIRE(!busy_, "TrainSession: another thread is running this session");
        busy_ = true;
        struct Clear {
            bool& flag;
            ~Clear() { flag = false; }
        } clear{busy_};
        nb::gil_scoped_release release;
        return f(s);
    }

    void close() {
        NL_REQUIRE(!busy_, "TrainSession: another thread is running this session");
        session_.reset();
    }

private:
    std::shared_ptr<TrainSession> session_;
    bool busy_ = false;  // read and written with the GIL held
};

// ---- the model a session or a checkpoint holds ----

// A trained Transformer with the metadata a train checkpoint of it carries. `model` may share
// ownership with the TrainSession that trains it.
struct PyModel {
    std::shared_ptr<Transformer> model;
    std::map<std::string, std::string> metadata;
};

PyModel session_model(PySession& py) {
    std::shared_ptr<TrainSession> session = py.shared();
    return {std::shared_ptr<Transformer>(session, &session->model()), session_metadata(*session)};
}

// ---- checkpoints ----

// A loaded train checkpoint (jobs/sample.h's TrainCheckpoint) with its model shared.
struct PyCheckpoint {
    std::string path;
    int64_t step = 0;
    nlohmann::json config;  // the resolved config it was trained with
    nlohmann::json vocab;   // a text model's codepoints in token order; null for a synthetic task
    int64_t vocab_size = 0;
    int64_t context = 0;
    std::string note;
    std::shared_ptr<TrainCheckpoint> loaded;  // owns the task or vocab, for decode
    PyModel model;
};

PyCheckpoint load_checkpoint_py(const std::string& path) {
    PyCheckpoint c;
    {
        nb::gil_scoped_release release;
        auto loaded = std::make_shared<TrainCheckpoint>(load_train_checkpoint(path));
        c.path = loaded->path;
        c.step = loaded->info.step;
        c.config = loaded->config.resolved;
        c.vocab = loaded->vocab ? checkpoint_metadata_json(loaded->info, loaded->path, "vocab") : nlohmann::json();
        c.vocab_size = loaded->config.model.vocab_size;
        c.context = loaded->context;
        c.note = loaded->note;
        c.model.metadata = loaded->info.metadata;
        c.model.model = std::shared_ptr<Transformer>(loaded, loaded->model.get());
        c.loaded = std::move(loaded);
    }
    return c;
}

std::string decode(const PyCheckpoint& c, const std::vector<int64_t>& tokens) {
    for (int64_t token : tokens)
        NL_REQUIRE(token >= 0 && token < c.vocab_size, "decode: token ", token, " is outside the vocab [0, ",
                   c.vocab_size, ")");
    if (c.loaded->vocab) return c.loaded->vocab->decode(tokens);
    return c.loaded->task->decode(tokens);
}

void save_checkpoint_py(const std::string& path, const PyModel& model, int64_t step,
                        const std::map<std::string, std::string>& metadata) {
    NL_REQUIRE(step >= 0, "save_checkpoint: step must be >= 0, found ", step);
    std::map<std::string, std::string> all = model.metadata;
    for (const auto& [key, value] : metadata) all[key] = value;
    nb::gil_scoped_release release;
    save_checkpoint(path, *model.model, nullptr, nullptr, step, all);
}

// ---- the stability job ----

// Runs the stability job; its runs go on the calling thread and jobs - 1 more, so on_epoch is called
// from any of them, with the GIL. Ctrl-C is seen at an epoch of a run on the calling thread (Python
// handles signals on its main thread only).
nb::dict stability(const ConfigArg& config, const std::vector<std::string>& overrides, const std::string& out,
                   bool force, bool resume, int jobs, nb::object on_start, nb::object on_epoch) {
    StabilityJob job;
    set_config(job, config);
    job.overrides = overrides;
    job.out = out;
    job.force = force;
    job.resume = resume;
    job.jobs = jobs;
    CallbackState state;  // a callback's Python error cancels the job (it writes error.txt)
    StabilityCallbacks callbacks;
    callbacks.on_start = [&](const StabilityStart& s) {
        if (on_start.is_none()) return;
        nb::gil_scoped_acquire gil;
        nb::dict info = result_to_python(s);
        state.call(on_start, info, "stability", "the start callback");
    };
    callbacks.on_epoch = [&](const StabilityEpoch& e) {
        nb::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0)
            state.cancel(nb::python_error(), "stability", fmt::format("a signal at {} epoch {}", e.run_id, e.epoch));
        if (on_epoch.is_none()) return;
        nb::dict d = result_to_python(e);
        state.call(on_epoch, d, "stability", fmt::format("the progress callback at {} epoch {}", e.run_id, e.epoch));
    };
    const StabilityResult result = run_without_gil(state, [&] { return run_stability(job, callbacks); });
    return result_to_python(result);
}

// ---- the sweep job ----

// Runs a sweep; its runs go on the calling thread and jobs - 1 more, so on_run is called from any of
// them, with the GIL. Ctrl-C is seen after a run the calling thread finished (Python handles signals
// on its main thread only).
nb::dict sweep(const ConfigArg& config, const std::vector<std::string>& overrides, const std::string& out, bool force,
               bool resume, int jobs, nb::object on_start, nb::object on_run) {
    SweepJob job;
    set_config(job, config);
    job.overrides = overrides;
    job.out = out;
    job.force = force;
    job.resume = resume;
    job.jobs = jobs;
    CallbackState state;  // a callback's Python error stops the sweep after the runs in flight
    SweepCallbacks callbacks;
    callbacks.on_start = [&](const SweepStart& s) {
        if (on_start.is_none()) return;
        nb::gil_scoped_acquire gil;
        nb::dict info = result_to_python(s);
        state.call(on_start, info, "sweep", "the start callback");
    };
    callbacks.on_run = [&](const SweepRunDone& r) {
        nb::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) state.cancel(nb::python_error(), "sweep", fmt::format("a signal after run {}", r.index));
        if (on_run.is_none()) return;
        nb::dict d = result_to_python(r);
        state.call(on_run, d, "sweep", fmt::format("the progress callback after run {}", r.index));
    };
    const SweepResult result = run_without_gil(state, [&] { return run_sweep(job, callbacks); });
    return result_to_python(result);
}

// ---- the sample job ----

nb::dict sample(const std::string& checkpoint, int64_t num, int64_t max_new_tokens, const std::string& prompt,
                std::optional<double> temperature, int64_t seed, bool kv_cache) {
    SampleJob job;
    job.checkpoint = checkpoint;
    job.num = num;
    job.max_new_tokens = max_new_tokens;
    job.prompt = prompt;
    job.temperature = temperature;
    job.seed = seed;
    job.kv_cache = kv_cache;
    std::optional<SampleResult> result;
    {
        nb::gil_scoped_release release;
        result = run_sample(job);
    }
    return result_to_python(sample_result_json(*result));
}

// ---- bindings ----

const char* const kConfigArgs =
    "config_path: a JSON config file, or \"\" for config_json (JSON text of a config object); config_name names "
    "an in-memory config in messages and in the default run directory runs/<name>-<timestamp>.";

void bind_model(nb::module_& m) {
    nb::class_<PyModel>(m, "Model",
                        "A trained Transformer: the model a TrainSession trains or a train checkpoint holds. Its "
                        "parameters are the live tensors (an in-place change under normlab.no_grad() changes the "
                        "model).")
        .def_prop_ro(
            "module", [](const PyModel& self) { return self.model; },
            "The C++ Transformer itself (normlab._normlab.nn.Transformer, shared): normlab.nn.Transformer.of(model) "
            "is its normlab.nn face.")
        .def(
            "forward",
            [](PyModel& self, const Var& ids) {
                nb::gil_scoped_release release;
                return self.model->forward(ids.data());
            },
            nb::arg("ids"),
            "ids: an int64 Tensor (B, T), each in [0, vocab_size), T <= max_seq_len -> logits (B, T, vocab_size). "
            "Records autograd's graph when grad mode is on.")
        .def(
            "__call__",
            [](PyModel& self, const Var& ids) {
                nb::gil_scoped_release release;
                return self.model->forward(ids.data());
            },
            nb::arg("ids"), "The same as forward(ids).")
        .def(
            "named_parameters", [](const PyModel& self) { return self.model->named_parameters(); },
            "[(name, Tensor)] in PyTorch's order, LLaMA's names (tok_embeddings.weight, layers.0.attention.wq.weight, ...).")
        .def(
            "parameters", [](const PyModel& self) { return self.model->parameters(); },
            "The parameters, in named_parameters' order.")
        .def(
            "state_dict",
            [](const PyModel& self) {
                std::vector<std::pair<std::string, Var>> entries;
                for (const auto& [name, tensor] : self.model->state_dict()) entries.emplace_back(name, Var(tensor));
                return entries;
            },
            "[(name, Tensor)]: parameters and buffers as a checkpoint holds them (the live data, not copies).")
        .def(
            "train", [](PyModel& self, bool mode) { self.model->train(mode); }, nb::arg("mode") = true,
            "Sets training mode (mode=True) or evaluation mode.")
        .def(
            "eval", [](PyModel& self) { self.model->eval(); }, "Sets evaluation mode.")
        .def_prop_ro(
            "training", [](const PyModel& self) { return self.model->is_training(); }, "Whether in training mode.")
        .def(
            "num_parameters",
            [](const PyModel& self, bool include_embeddings) {
                return count_parameters(*self.model, include_embeddings);
            },
            nb::arg("include_embeddings") = true, "Parameter count (elements); without the embedding table on request.")
        .def_prop_ro(
            "vocab_size", [](const PyModel& self) { return self.model->options().vocab_size; }, "The vocab size.")
        .def_prop_ro(
            "max_seq_len", [](const PyModel& self) { return self.model->options().max_seq_len; },
            "The longest input (positions).")
        .def(
            "__repr__", [](const PyModel& self) { return self.model->str(); }, "The module tree, PyTorch-style.");
}

void bind_train(nb::module_& m) {
    m.def("metrics_columns", &metrics_columns,
          "metrics.csv's columns, in order (jobs/train.h metrics_row): the keys every step dict shares.");
    static const std::string train_doc =
        (std::string("Runs the train job (jobs/train.h) with the GIL released; normlab.train wraps it. ") + kConfigArgs +
         " on_start(dict) is called once set up (description, run_dir, start_step, end_step, steps, log_every), "
         "on_step(dict) after every step. A KeyboardInterrupt (Ctrl-C, or raised by a callback) stops the run after "
         "that step with a checkpoint and is raised again; another exception from a callback leaves error.txt and "
         "is raised. Returns a dict: run_dir, complete, last_step, summary, steps (a dict per step), profile.");
    m.def(
        "train",
        [](const std::string& config_path, const std::string& config_json, const std::string& config_name,
           const std::vector<std::string>& overrides, const std::string& out, bool force, bool resume,
           int64_t stop_after, bool profile, nb::object on_start, nb::object on_step) {
            return train({config_path, config_json, config_name}, overrides, out, force, resume, stop_after, profile,
                         on_start, on_step);
        },
        nb::arg("config_path"), nb::arg("config_json"), nb::arg("config_name"), nb::arg("overrides"),
        nb::arg("out"), nb::arg("force"), nb::arg("resume"), nb::arg("stop_after"), nb::arg("profile"),
        nb::arg("on_start").none(), nb::arg("on_step").none(),
        train_doc.c_str());

    nb::class_<PySession>(m, "TrainSession",
                          "The train job a step at a time (jobs/train.h's TrainSession); normlab.TrainSession wraps "
                          "it. Each call releases the GIL while it computes.")
        .def(nb::init<const std::string&, const std::string&, const std::string&, const std::vector<std::string>&,
                      const std::string&, bool, bool, int64_t, bool>(),
             nb::arg("config_path"), nb::arg("config_json"), nb::arg("config_name"), nb::arg("overrides"), nb::arg("out"), nb::arg("force"), nb::arg("resume"),
             nb::arg("stop_after"), nb::arg("profile"),
             "Reads and validates the config (config_path, or config_json named config_name) with the overrides, "
             "reads the data, creates (or with resume reopens) the run directory, builds the model and AdamW. "
             "Nothing is written before every check passed.")
        .def(
            "run_step", [](PySession& self) { return step_dict(self.run([](TrainSession& s) { return s.run_step(); })); },
            "One optimizer step, then the evaluation, metrics row and checkpoint when due; the step as a dict.")
        .def(
            "evaluate", [](PySession& self) { return eval_dict(self.run([](TrainSession& s) { return s.evaluate(); })); },
            "The held-out set's loss and accuracies now: {val_loss, val_accuracy, val_token_accuracy}.")
        .def(
            "stop_here", [](PySession& self) { self.run([](TrainSession& s) { s.stop_here(); }); },
            "Ends the session after the current step, writing its checkpoint (unless it has one).")
        .def(
            "finish", [](PySession& self) { return result_dict(self.run([](TrainSession& s) { return s.finish(); })); },
            "Ends the session: the profile, then summary.json when every step has run. The result dict, its steps "
            "list empty (normlab.TrainSession keeps the steps).")
        .def("close", &PySession::close,
             "Drops the session (and its run directory's lock) once no model taken from it is alive.")
        .def_prop_ro(
            "description", [](PySession& self) { return self.session().description(); },
            "\"108224 parameters, reverse data, vocab 11, T = 16, on cpu, 1 process, run directory runs/...\".")
        .def_prop_ro(
            "run_dir", [](PySession& self) { return self.session().run_dir(); }, "The run directory.")
        .def_prop_ro(
            "step", [](PySession& self) { return self.session().step(); },
            "Steps done (the checkpoint's step right after a resume).")
        .def_prop_ro(
            "end_step", [](PySession& self) { return self.session().end_step(); },
            "Where the session stops: /train/steps, or stop_after.")
        .def_prop_ro(
            "done", [](PySession& self) { return self.session().done(); }, "step == end_step.")
        .def_prop_ro(
            "config", [](PySession& self) { return to_python(self.session().config().resolved); },
            "The config with every default filled in (what config.json holds), as a dict.")
        .def_prop_ro(
            "log_every", [](PySession& self) { return self.session().config().train.log_every; },
            "/train/log_every: how often a progress line is printed.")
        .def_prop_ro("model", &session_model, "The model being trained (a Model; its parameters are live).");
}

void bind_checkpoints(nb::module_& m) {
    nb::class_<PyCheckpoint>(m, "Checkpoint",
                             "A train checkpoint loaded with what it carries: the model, the config it was trained "
                             "with, its step and vocab.")
        .def_ro("path", &PyCheckpoint::path, "The checkpoint file read.")
        .def_ro("step", &PyCheckpoint::step, "Its training step.")
        .def_prop_ro(
            "config", [](const PyCheckpoint& c) { return to_python(c.config); },
            "The resolved config it was trained with, as a dict.")
        .def_prop_ro(
            "vocab",
            [](const PyCheckpoint& c) -> nb::object {
                if (c.vocab.is_null()) return nb::none();
                nb::list chars;
                for (const nlohmann::json& codepoint : c.vocab)
                    chars.append(nb::steal(PyUnicode_FromOrdinal(static_cast<int>(codepoint.get<int64_t>()))));
                return chars;
            },
            "A text model's characters in token order (token i is vocab[i]); None for a synthetic task.")
        .def_ro("vocab_size", &PyCheckpoint::vocab_size, "The model's vocab size.")
        .def_ro("context", &PyCheckpoint::context, "The window generation uses: the trained sequence length.")
        .def_ro("note", &PyCheckpoint::note, "A remark for the user (\"\" for none), e.g. on the window.")
        .def_ro("model", &PyCheckpoint::model, "The model with the checkpoint's weights (on the CPU).")
        .def("decode", &decode, nb::arg("tokens"), "Token ids as readable text (the task's symbols or the characters).")
        .def(
            "__repr__",
            [](const PyCheckpoint& c) {
                return fmt::format("Checkpoint(path='{}', step={}, vocab_size={})", c.path, c.step, c.vocab_size);
            },
            "The path, step and vocab size.");

    m.def("load_checkpoint", &load_checkpoint_py, nb::arg("path"),
          "Loads a train checkpoint, or a run directory's latest one, with its config, vocab and model (the "
          "optimizer state is not read). normlab.Error naming the path when it is missing or not a train checkpoint.");
    m.def("save_checkpoint", &save_checkpoint_py, nb::arg("path"), nb::arg("model"), nb::arg("step"),
          nb::arg("metadata"),
          "Writes the model's weights as a safetensors checkpoint at `path` (atomically) with `step`, the "
          "model's own metadata (its config, trained sequence length and vocab, so the file is a train checkpoint "
          "that load_checkpoint and sample read) and `metadata` (str -> str) on top. No optimizer state.");
}

void bind_stability(nb::module_& m) {
    static const std::string stability_doc =
        (std::string("Runs the stability job (jobs/stability.h) with the GIL released; normlab.stability wraps "
                     "it. ") +
         kConfigArgs +
         " out: the run directory; resume: run the runs without result.json; jobs: runs at once (0: one per "
         "core, at most the runs). on_start(dict: description, epochs, total, runs, resumed), on_epoch(dict: run_id, "
         "perturbed, epoch, loss, done, diverged_epoch), called from the runs' threads. An exception from a "
         "callback, or a KeyboardInterrupt, cancels the job between epochs (error.txt; the runs in flight finish "
         "and keep their result.json) and is raised. Returns a dict: run_dir, summary, table, notes, plots, runs (a "
         "dict per run with its curves).");
    m.def(
        "stability",
        [](const std::string& config_path, const std::string& config_json, const std::string& config_name,
           const std::vector<std::string>& overrides, const std::string& out, bool force, bool resume, int jobs,
           nb::object on_start, nb::object on_epoch) {
            return stability({config_path, config_json, config_name}, overrides, out, force, resume, jobs, on_start,
                             on_epoch);
        },
        nb::arg("config_path"), nb::arg("config_json"), nb::arg("config_name"), nb::arg("overrides"),
        nb::arg("out"), nb::arg("force"), nb::arg("resume"), nb::arg("jobs"), nb::arg("on_start").none(),
        nb::arg("on_epoch").none(),
        stability_doc.c_str());
    static const std::string sweep_doc =
        std::string("Runs the sweep job (normlab sweep: a grid of train runs x seeds; jobs/sweep.h). ") + kConfigArgs +
        " out: the sweep directory; resume: run the runs without result.json; jobs: runs at once (0: one per "
        "core). on_start(dict: description, runs, resumed, mine), on_run(dict: index, label, diverged, "
        "diverged_at_step, final_val_loss, seconds, done, mine), called from the runs' threads. Returns a dict: "
        "run_dir, summary, table, plots, columns and rows (runs.csv's cells as text).";
    m.def(
        "sweep",
        [](const std::string& config_path, const std::string& config_json, const std::string& config_name,
           const std::vector<std::string>& overrides, const std::string& out, bool force, bool resume, int jobs,
           nb::object on_start, nb::object on_run) {
            return sweep({config_path, config_json, config_name}, overrides, out, force, resume, jobs, on_start,
                         on_run);
        },
        nb::arg("config_path"), nb::arg("config_json"), nb::arg("config_name"), nb::arg("overrides"),
        nb::arg("out"), nb::arg("force"), nb::arg("resume"), nb::arg("jobs"), nb::arg("on_start").none(),
        nb::arg("on_run").none(), sweep_doc.c_str());
}

void bind_sample(nb::module_& m) {
    m.def("sample", &sample, nb::arg("checkpoint"), nb::arg("num"), nb::arg("max_new_tokens"), nb::arg("prompt"),
          nb::arg("temperature").none(), nb::arg("seed"), nb::arg("kv_cache"),
          "Runs the sample job (jobs/sample.h) with the GIL released; normlab.sample wraps it. Returns a dict: "
          "checkpoint, step, problems (a dict each: problem, answer, expected, correct), correct, text, tokens, "
          "context, temperature, kv_cache, new_tokens, seconds, tokens_per_s, note.");
}

void bind_export(nb::module_& m) {
    m.def(
        "export_model",
        [](const std::string& checkpoint, const std::string& to, const std::string& out, const std::string& dtype,
           bool force) {
            NL_REQUIRE(dtype == "f32" || dtype == "f16" || dtype == "bf16", "export: dtype must be f32, f16 or bf16, got '",
                       dtype, "'");
            ExportOptions options;
            options.to = to;
            options.out = out;
            options.dtype = dtype_from_name(dtype);
            options.force = force;
            ExportResult r;
            {
                nb::gil_scoped_release release;
                r = run_export(checkpoint, options);
            }
            return result_to_python(r);
        },
        nb::arg("checkpoint"), nb::arg("to"), nb::arg("out"), nb::arg("dtype"), nb::arg("force"),
        "Runs the export job (jobs/export.h) with the GIL released; normlab.export wraps it. Returns a dict: source, "
        "step, parameters, tokenizer, architecture, out.");
}

void bind_convert(nb::module_& m) {
    m.def(
        "convert_model",
        [](const std::string& checkpoint, const std::string& to, const std::string& out, bool force) {
            ConvertOptions options;
            options.to = to;
            options.out = out;
            options.force = force;
            ConvertResult r;
            {
                nb::gil_scoped_release release;
                r = run_convert(checkpoint, options);
            }
            return result_to_python(r);
        },
        nb::arg("checkpoint"), nb::arg("to"), nb::arg("out"), nb::arg("force"),
        "Runs the convert job (jobs/convert.h) with the GIL released; normlab.convert wraps it. Returns a dict: "
        "source, step, norms, recentered, parameters, out.");
}

void bind_analyze(nb::module_& m) {
    m.def(
        "analyze",
        [](const std::string& model, const std::string& tokens, const std::string& text, const std::string& token_dtype,
           int64_t windows, int64_t seq_len, const std::string& dtype, bool convert_check, const std::string& out,
           bool force) {
            AnalyzeOptions o;
            o.model = model;
            o.tokens = tokens;
            o.text = text;
            o.token_dtype = token_dtype;
            o.windows = windows;
            o.seq_len = seq_len;
            o.dtype = dtype;
            o.convert_check = convert_check;
            o.out = out;
            o.force = force;
            AnalyzeResult r;
            {
                nb::gil_scoped_release release;
                r = run_analyze(o);
            }
            return to_python(r.analysis);
        },
        nb::arg("model"), nb::arg("tokens"), nb::arg("text"), nb::arg("token_dtype"), nb::arg("windows"),
        nb::arg("seq_len"), nb::arg("dtype"), nb::arg("convert_check"), nb::arg("out"), nb::arg("force"),
        "Runs the analyze job (jobs/analyze.h) with the GIL released; normlab.analyze wraps it. Returns analysis.json's "
        "object as a dict.");
}

// The config schema (jobs/config_schema.h) as JSON text: normlab.config_schema and config_defaults
// parse it, so Python states no default of its own.
void bind_config_schema(nb::module_& m) {
    m.def("config_jobs", &config_jobs, "The jobs that read a config file: train, stability, sweep, bench_norms.");
    m.def(
        "config_schema", [](const std::string& job) { return json_schema(config_schema(job)).dump(); },
        nb::arg("job"), "The JSON Schema (draft 2020-12) of the job's config files, as JSON text.");
    m.def(
        "config_defaults", [](const std::string& job) { return config_defaults(config_schema(job)).dump(); },
        nb::arg("job"), "A config of the job holding every fixed default, as JSON text.");
}

}  // namespace

void bind_jobs(nb::module_& m) {
    bind_config_schema(m);
    bind_model(m);
    bind_train(m);
    bind_checkpoints(m);
    bind_stability(m);
    bind_sample(m);
    bind_export(m);
    bind_convert(m);
    bind_analyze(m);
}

}  // namespace nl::py
