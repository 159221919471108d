// mgpu_bench._native: the measuring core. Users import mgpu_bench, never this module.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "comm_session.hpp"
#include "cublaslt.hpp"
#include "device.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "gemm.hpp"
#include "links.hpp"
#include "memory.hpp"
#include "op.hpp"
#include "sdc.hpp"

namespace py = pybind11;
using namespace mgpu;

namespace {

// Raises mgpu_bench.core.errors.<name>(message, code): the Python classes keep the code and pickle.
void raise_python(const char* name, const Error& e) {
  py::object cls = py::module_::import("mgpu_bench.core.errors").attr(name);
  py::object exc = cls(e.what(), e.code());
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

// Ctrl-C while the ranks run: Python's handler raises KeyboardInterrupt here, the session
// aborts its communicators, and the interrupt reaches the caller.
void interrupt_check() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

py::dict counts_dict(const OpCounts& c) {
  py::dict d;
  d["bytes"] = c.bytes;
  d["count"] = c.count;
  d["send_count"] = c.send_count;
  d["recv_count"] = c.recv_count;
  d["send_inplace_offset"] = c.send_inplace_offset;
  d["recv_inplace_offset"] = c.recv_inplace_offset;
  return d;
}

py::dict churn_dict(const ChurnResult& r) {
  py::dict d;
  d["allocator"] = r.allocator;
  d["pattern"] = r.pattern;
  d["free_before"] = r.free_before;
  d["total"] = r.total;
  d["budget"] = r.budget;
  d["free_after_pattern"] = r.free_after_pattern;
  d["held_bytes"] = r.held_bytes;
  d["allocations_done"] = r.allocations_done;
  d["allocations_failed"] = r.allocations_failed;
  d["largest_block"] = r.largest_block;
  d["search_seconds"] = r.search_seconds;
  d["search_probes"] = r.search_probes;
  d["pool_reserved"] = r.pool_reserved;  // None unless the allocator has a pool ("async")
  d["pool_used"] = r.pool_used;
  py::list events;
  const py::str alloc_kind("alloc"), free_kind("free");
  for (const MemoryEvent& e : r.events) {
    events.append(py::make_tuple(e.is_free ? free_kind : alloc_kind, e.bytes, e.seconds));
  }
  d["events"] = events;
  return d;
}

py::dict sdc_algo_dict(const SdcAlgo& a) {
  py::dict d;
  d["blob"] = py::bytes(a.blob);
  d["algo_id"] = a.algo_id;
  d["tile"] = a.tile;
  d["stages"] = a.stages;
  d["split_k"] = a.split_k;
  d["reduction"] = a.reduction;
  d["swizzle"] = a.swizzle;
  d["custom"] = a.custom;
  d["cluster"] = a.cluster;
  d["workspace"] = a.workspace;
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "mgpu-bench native core: NCCL collective timing, cuBLASLt GEMM probe, device facts";
  m.attr("__version__") = MGPU_VERSION;
  m.attr("NCCL_HEADER_VERSION") = NCCL_VERSION_CODE;
  m.attr("HAVE_NCCL_FP8") = static_cast<bool>(MGPU_HAVE_NCCL_FP8);

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OutOfMemoryError& e) {
      raise_python("OutOfMemoryError", e);
    } catch (const TimeoutError& e) {
      raise_python("CommTimeoutError", e);
    } catch (const CudaError& e) {
      raise_python("CudaError", e);
    } catch (const NcclError& e) {
      raise_python("NcclError", e);
    } catch (const CublasError& e) {
      raise_python("CublasError", e);
    } catch (const Error& e) {
      raise_python("MgpuError", e);
    }
  });

  m.def("ops", [] {
    py::list out;
    for (const OpDesc* d : op_registry()) {
      py::dict info;
      info["name"] = d->name;
      info["reduces"] = d->reduces;
      info["rooted"] = d->rooted;
      info["inplace"] = d->inplace;
      out.append(info);
    }
    return out;
  }, "The registered collectives: name, whether they reduce, whether they have a root.");

  m.def("dtypes", &dtype_names, "Element types, as the CLI spells them.");
  m.def("dtype_size", [](const std::string& name) { return dtype_info(name).size; });

  m.def("op_counts", [](const std::string& op, size_t bytes, const std::string& dtype,
                        int nranks) {
    if (nranks < 1) throw std::invalid_argument("nranks must be >= 1");
    return counts_dict(find_op(op).counts(bytes, dtype_info(dtype).size, nranks));
  }, py::arg("op"), py::arg("bytes"), py::arg("dtype"), py::arg("nranks"),
     "Element counts of one measurement (nccl-tests' rules); bytes is the rounded size.");

  m.def("device_count", &device_count, py::call_guard<py::gil_scoped_release>());
  m.def("device_info", [](int index) {
    DeviceInfo i;
    {
      py::gil_scoped_release release;
      i = device_info(index);
    }
    py::dict d;
    d["index"] = i.index;
    d["name"] = i.name;
    d["uuid"] = i.uuid;
    d["pci_bus_id"] = i.pci_bus_id;
    d["total_memory"] = i.total_memory;
    d["compute_capability"] = py::make_tuple(i.cc_major, i.cc_minor);
    d["multiprocessors"] = i.multiprocessors;
    return d;
  });
  m.def("mem_get_info", &mem_get_info, py::call_guard<py::gil_scoped_release>(),
        "(free, total) bytes of one device.");
  m.def("driver_version", &driver_version);
  m.def("runtime_version", &runtime_version);
  m.def("nccl_version", &nccl_version);
  m.def("cublaslt_version", &cublaslt_version);
  m.def("nccl_unique_id", [] { return py::bytes(nccl_unique_id()); });
  m.def("_raise_library_error", &raise_library_error, py::arg("library"));

  m.def("can_access_peer", &can_access_peer, py::arg("a"), py::arg("b"),
        py::call_guard<py::gil_scoped_release>());
  m.def("links_copy", [](int src, int dst, size_t bytes, const std::string& engine,
                         bool bidirectional, int warmup, int iters) {
    CopyArgs a;
    a.src = src;
    a.dst = dst;
    a.bytes = bytes;
    a.engine = engine;
    a.bidirectional = bidirectional;
    a.warmup = warmup;
    a.iters = iters;
    CopyResult r;
    {
      py::gil_scoped_release release;
      r = measure_copy(a);
    }
    py::dict d;
    d["seconds"] = r.seconds;
    d["peer_access"] = r.peer_access;
    return d;
  }, py::arg("src"), py::arg("dst"), py::arg("bytes"), py::arg("engine"),
     py::arg("bidirectional"), py::arg("warmup"), py::arg("iters"),
     "Seconds per copy of `bytes` from GPU src to GPU dst (both ways at once if bidirectional).");
  m.def("links_read_latency", &measure_read_latency, py::arg("reader"), py::arg("owner"),
        py::arg("span_bytes"), py::arg("loads"), py::arg("iters"),
        py::call_guard<py::gil_scoped_release>(),
        "Seconds per dependent 4-byte load by GPU reader from GPU owner's memory.");
  m.def("links_host_copy", &measure_host_copy, py::arg("device"), py::arg("bytes"),
        py::arg("to_device"), py::arg("warmup"), py::arg("iters"),
        py::call_guard<py::gil_scoped_release>(),
        "Seconds per pinned-host <-> device copy of `bytes`.");

  py::class_<GemmProbe>(m, "GemmProbe")
      .def(py::init([](int device, const std::string& dtype, const std::string& layout,
                       int64_t m, int64_t n, int64_t k, size_t workspace, uint64_t seed,
                       bool fp8_fast_accum, int init) {
             py::gil_scoped_release release;
             return std::make_unique<GemmProbe>(device, dtype, layout, GemmShape{m, n, k},
                                                workspace, seed, fp8_fast_accum, init);
           }),
           py::arg("device"), py::arg("dtype"), py::arg("layout"), py::arg("max_m"),
           py::arg("max_n"), py::arg("max_k"), py::arg("workspace"), py::arg("seed"),
           py::arg("fp8_fast_accum") = false, py::arg("init") = 0)
      .def("measure", [](GemmProbe& p, int64_t m, int64_t n, int64_t k, int candidates, int samples,
                         double sample_s, int warmup, bool check) {
        GemmMeasureArgs a;
        a.shape = GemmShape{m, n, k};
        a.candidates = candidates;
        a.samples = samples;
        a.sample_s = sample_s;
        a.warmup = warmup;
        a.check = check;
        GemmMeasurement r;
        {
          py::gil_scoped_release release;
          r = p.measure(a);
        }
        py::list cands;
        for (const GemmCandidate& c : r.candidates) {
          py::dict d;
          d["index"] = c.index;
          d["algo_id"] = c.algo_id;
          d["tile"] = c.tile;
          d["stages"] = c.stages;
          d["split_k"] = c.split_k;
          d["reduction"] = c.reduction;
          d["swizzle"] = c.swizzle;
          d["custom"] = c.custom;
          d["cluster"] = c.cluster;
          d["workspace"] = c.workspace;
          d["waves"] = c.waves;
          d["seconds"] = c.seconds;
          d["iters_per_sample"] = c.iters_per_sample;
          d["max_error"] = c.max_error < 0 ? py::object(py::none()) : py::object(py::float_(c.max_error));
          d["error"] = c.error.empty() ? py::object(py::none()) : py::object(py::str(c.error));
          cands.append(d);
        }
        py::dict out;
        out["candidates"] = cands;
        out["buffer_sets"] = r.buffer_sets;
        out["checked_elements"] = r.checked_elements;
        return out;
      }, py::arg("m"), py::arg("n"), py::arg("k"), py::arg("candidates"), py::arg("samples"),
         py::arg("sample_s"), py::arg("warmup"), py::arg("check"),
         "Times the heuristic's first `candidates` algorithms: raw seconds per GEMM per burst.")
      .def("sustain", [](GemmProbe& p, int64_t m, int64_t n, int64_t k, int index, double duration_s,
                         double interval_s) {
        SustainSeries r;
        {
          py::gil_scoped_release release;
          r = p.sustain(GemmShape{m, n, k}, index, duration_s, interval_s);
        }
        return r;
      }, py::arg("m"), py::arg("n"), py::arg("k"), py::arg("index"), py::arg("duration_s"),
         py::arg("interval_s"),
         "[(monotonic seconds at a burst's end, seconds per GEMM)] over duration_s.")
      .def("stop", &GemmProbe::stop, "Ends a running measure()/sustain() at its next burst.")
      .def_property_readonly("stopped", &GemmProbe::stopped)
      .def_property_readonly("arena_bytes", &GemmProbe::arena_bytes)
      .def_property_readonly("device", &GemmProbe::device);

  py::class_<SdcProbe>(m, "SdcProbe")
      .def(py::init([](int device, const std::string& dtype, int64_t m, int64_t n, int64_t k,
                       uint64_t seed) {
             py::gil_scoped_release release;
             return std::make_unique<SdcProbe>(device, dtype, m, n, k, seed);
           }),
           py::arg("device"), py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("k"),
           py::arg("seed"))
      .def("select_algo", [](SdcProbe& p) {
        SdcAlgo a;
        {
          py::gil_scoped_release release;
          a = p.select_algo();
        }
        return sdc_algo_dict(a);
      }, "Pins the heuristic's first algorithm without split-K or reduction; its description.")
      .def("set_algo", [](SdcProbe& p, const py::bytes& blob) {
        const std::string b = blob;
        SdcAlgo a;
        {
          py::gil_scoped_release release;
          a = p.set_algo(b);
        }
        return sdc_algo_dict(a);
      }, py::arg("blob"), "Pins another probe's algorithm (its select_algo()['blob']).")
      .def("gemm", [](SdcProbe& p, int count, int corrupt_gemm, int64_t corrupt_element) {
        SdcGemmResult r;
        {
          py::gil_scoped_release release;
          r = p.gemm(count, corrupt_gemm, corrupt_element);
        }
        py::dict d;
        d["hashes"] = r.hashes;
        d["seconds"] = r.seconds;
        d["differs"] = r.differs;
        d["made_reference"] = r.made_reference;
        return d;
      }, py::arg("count"), py::arg("corrupt_gemm") = -1, py::arg("corrupt_element") = 0,
         "Runs `count` GEMMs, each hashed; stops after the first whose hash differs from the reference.")
      .def("output", [](const SdcProbe& p, bool reference) {
        py::array_t<uint16_t> out(static_cast<py::ssize_t>(p.output_bytes() / 2));
        void* host = out.mutable_data();
        const size_t bytes = p.output_bytes();
        {
          py::gil_scoped_release release;
          p.copy_output(reference, host, bytes);
        }
        return out;
      }, py::arg("reference"), "D (or the reference copy) as raw 16-bit elements, column-major.")
      .def("hbm_allocate", &SdcProbe::hbm_allocate, py::arg("bytes"),
           py::call_guard<py::gil_scoped_release>())
      .def("hbm_release", &SdcProbe::hbm_release, py::call_guard<py::gil_scoped_release>())
      .def("hbm_check", [](SdcProbe& p, uint64_t seed, int64_t corrupt_word) {
        SdcHbmResult r;
        {
          py::gil_scoped_release release;
          r = p.hbm_check(seed, corrupt_word);
        }
        py::dict d;
        d["bytes"] = r.bytes;
        d["mismatches"] = r.mismatches;
        d["first_word"] = r.first_word;
        d["first_got"] = r.first_got;
        d["first_want"] = r.first_want;
        d["write_seconds"] = r.write_seconds;
        d["read_seconds"] = r.read_seconds;
        return d;
      }, py::arg("seed"), py::arg("corrupt_word") = -1,
         "Writes the pattern of `seed` over the HBM buffer, reads it back, compares on the GPU.")
      .def("stop", &SdcProbe::stop, "Ends a running gemm() after its current GEMM.")
      .def_property_readonly("stopped", &SdcProbe::stopped)
      .def_property_readonly("reference_hash", &SdcProbe::reference_hash)
      .def_property_readonly("has_reference", &SdcProbe::has_reference)
      .def_property_readonly("hbm_bytes", &SdcProbe::hbm_bytes)
      .def_property_readonly("device", &SdcProbe::device);
  m.def("sdc_hash", [](int device, const py::bytes& data) {
    const std::string b = data;
    py::gil_scoped_release release;
    return sdc_hash_host_data(device, b);
  }, py::arg("device"), py::arg("data"),
     "The sdc probe's hash of `data` (zero-padded to 8 bytes), computed on GPU `device`.");

  py::class_<MeasureArgs>(m, "MeasureArgs")
      .def(py::init<>())
      .def_readwrite("op", &MeasureArgs::op)
      .def_readwrite("dtype", &MeasureArgs::dtype)
      .def_readwrite("redop", &MeasureArgs::redop)
      .def_readwrite("bytes", &MeasureArgs::bytes)
      .def_readwrite("inplace", &MeasureArgs::inplace)
      .def_readwrite("root", &MeasureArgs::root)
      .def_readwrite("warmup_iters", &MeasureArgs::warmup_iters)
      .def_readwrite("iters", &MeasureArgs::iters)
      .def_readwrite("min_time_s", &MeasureArgs::min_time_s)
      .def_readwrite("min_iters", &MeasureArgs::min_iters)
      .def_readwrite("max_iters", &MeasureArgs::max_iters)
      .def_readwrite("graph", &MeasureArgs::graph)
      .def_readwrite("check", &MeasureArgs::check)
      .def_readwrite("sample_target_s", &MeasureArgs::sample_target_s)
      .def_readwrite("corrupt_rank", &MeasureArgs::corrupt_rank)
      .def_readwrite("fail_rank", &MeasureArgs::fail_rank);

  py::class_<CommSession>(m, "CommSession")
      .def(py::init([](std::vector<int> devices, int nranks, int first_rank,
                       const std::string& unique_id, double timeout_s) {
             py::gil_scoped_release release;
             return std::make_unique<CommSession>(std::move(devices), nranks, first_rank,
                                                  unique_id, timeout_s, interrupt_check);
           }),
           py::arg("devices"), py::arg("nranks"), py::arg("first_rank"), py::arg("unique_id"),
           py::arg("timeout_s"))
      .def("measure", [](CommSession& s, const MeasureArgs& a) {
        MeasureResult r;
        {
          py::gil_scoped_release release;
          r = s.measure(a);
        }
        py::dict d;
        d["counts"] = counts_dict(r.counts);
        d["iters"] = r.iters;
        d["batch"] = r.batch;
        d["burst_seconds"] = r.burst_seconds;
        const size_t ranks = r.samples.size();
        const size_t nsamples = ranks ? r.samples[0].size() : 0;
        py::array_t<double> samples({ranks, nsamples});
        auto view = samples.mutable_unchecked<2>();
        for (size_t i = 0; i < ranks; ++i) {
          for (size_t k = 0; k < r.samples[i].size(); ++k) view(i, k) = r.samples[i][k];
        }
        d["samples"] = samples;
        d["wrong"] = r.wrong;
        d["first_wrong"] = r.first_wrong;
        d["first_wrong_got"] = r.first_wrong_got;
        d["first_wrong_want"] = r.first_wrong_want;
        d["warmup_seconds_per_iter"] = r.warmup_seconds_per_iter;
        return d;
      }, py::arg("args"),
      "Runs one measurement on every local rank (GIL released); raw seconds, no statistics.")
      .def("abort", &CommSession::abort, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("alive", &CommSession::alive)
      .def_property_readonly("nranks", &CommSession::nranks)
      .def_property_readonly("first_rank", &CommSession::first_rank)
      .def_property_readonly("devices", &CommSession::devices)
      .def_property("timeout", &CommSession::timeout, &CommSession::set_timeout);

  m.def("memory_allocators", &memory_allocators,
        "Allocators memory_churn runs: cudaMalloc, async (a stream-ordered pool), vmm.");
  m.def("memory_patterns", &memory_patterns, "Churn patterns memory_churn runs.");
  m.def("memory_churn", [](int device, const std::string& allocator, const std::string& pattern,
                           uint64_t seed, double budget_fraction) {
    ChurnResult r;
    {
      py::gil_scoped_release release;
      r = memory_churn(device, allocator, pattern, seed, budget_fraction);
    }
    return churn_dict(r);
  }, py::arg("device"), py::arg("allocator"), py::arg("pattern"), py::arg("seed") = 0,
     py::arg("budget_fraction") = 0.9,
     "Runs one churn pattern with one allocator, then finds the largest block still "
     "allocatable; raw bytes and seconds.");
  m.def("_memory_churn_simulated", [](const std::string& pattern, uint64_t seed,
                                      double budget_fraction, size_t capacity) {
    ChurnResult r;
    {
      py::gil_scoped_release release;
      r = memory_churn_simulated(pattern, seed, budget_fraction, capacity);
    }
    return churn_dict(r);
  }, py::arg("pattern"), py::arg("seed"), py::arg("budget_fraction"), py::arg("capacity"),
     "memory_churn on a simulated first-fit arena of `capacity` bytes (no CUDA): for tests.");
  m.def("hbm_kinds", &hbm_kinds, "Measurements hbm_bandwidth runs: copy_ce, copy_sm, read, write.");
  m.def("hbm_bandwidth", [](int device, const std::string& kind, size_t bytes, int warmup,
                            int iters) {
    BandwidthResult r;
    {
      py::gil_scoped_release release;
      r = hbm_bandwidth(device, kind, bytes, warmup, iters);
    }
    py::dict d;
    d["seconds"] = r.seconds;
    d["bytes_read"] = r.bytes_read;
    d["bytes_written"] = r.bytes_written;
    return d;
  }, py::arg("device"), py::arg("kind"), py::arg("bytes") = size_t(4) << 30, py::arg("warmup") = 3,
     py::arg("iters") = 20,
     "Seconds per repetition of one HBM measurement (copy_ce, copy_sm, read, write) on one GPU.");
}
