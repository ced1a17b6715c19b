// lockstep._core's entry points for tests and tools (bindings.h): the host kernel on
// memory Python owns, and what record_packed() makes of one row. They raise ValueError
// or return None; training hooks never call them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "lockstep/agent/host_stats.h"
#include "lockstep/agent/packed_rows.h"

namespace lockstep::python {
namespace {

py::dict StatsToDict(const TensorStats& s) {
  py::dict d;
  d["numel"] = s.numel;
  d["min"] = s.min;
  d["max"] = s.max;
  d["mean"] = s.mean;
  d["std"] = s.std;
  d["l2"] = s.l2;
  d["absmax"] = s.absmax;
  d["nan_count"] = s.nan_count;
  d["inf_count"] = s.inf_count;
  d["zero_count"] = s.zero_count;
  d["sat_count"] = s.sat_count;
  d["subnormal_count"] = s.subnormal_count;
  d["limit_dtype"] = static_cast<int>(s.limit_dtype);
  py::list sketch, hist;
  for (int i = 0; i < s.sketch_k; ++i) sketch.append(s.sketch[i]);
  for (int i = 0; i < s.hist_bins; ++i) hist.append(s.hist[i]);
  d["sketch"] = sketch;
  d["hist"] = hist;
  return d;
}

}  // namespace

void BindHostStats(py::module_& m) {
  // For tests and tools: the host kernel on `numel` contiguous elements at address
  // `data_ptr` (the caller keeps the memory alive). Raises ValueError on a bad dtype.
  m.def(
      "host_stats",
      [](uintptr_t data_ptr, uint64_t numel, int dtype, int sketch_k, int hist_bins) {
        StatsConfig cfg;
        cfg.sketch_k = sketch_k;
        cfg.hist_bins = hist_bins;
        TensorStats stats;
        Status s;
        {
          py::gil_scoped_release release;
          s = ComputeHostStats(reinterpret_cast<const void*>(data_ptr),
                               static_cast<DType>(dtype), numel, cfg, &stats);
        }
        if (!s.ok()) throw py::value_error(s.message());
        return StatsToDict(stats);
      },
      py::arg("data_ptr"), py::arg("numel"), py::arg("dtype"),
      py::arg("sketch_k") = kDefaultSketchK, py::arg("hist_bins") = kHistBins);
  // The same for a strided view at `data_ptr` (its first element; sizes and strides in
  // elements, as torch gives them). Raises ValueError for a layout it cannot read.
  m.def(
      "host_stats_strided",
      [](uintptr_t data_ptr, int dtype, const std::vector<int64_t>& sizes,
         const std::vector<int64_t>& strides, int sketch_k, int hist_bins) {
        if (sizes.size() != strides.size())
          throw py::value_error("host_stats_strided: " + std::to_string(sizes.size()) +
                                " sizes but " + std::to_string(strides.size()) + " strides.");
        HostLayout layout;
        Status s = MakeHostLayout(sizes.data(), strides.data(), static_cast<int>(sizes.size()),
                                  &layout);
        StatsConfig cfg;
        cfg.sketch_k = sketch_k;
        cfg.hist_bins = hist_bins;
        TensorStats stats;
        if (s.ok()) {
          py::gil_scoped_release release;
          s = ComputeHostStatsStrided(reinterpret_cast<const void*>(data_ptr),
                                      static_cast<DType>(dtype), layout, cfg, &stats);
        }
        if (!s.ok()) throw py::value_error(s.message());
        return StatsToDict(stats);
      },
      py::arg("data_ptr"), py::arg("dtype"), py::arg("sizes"), py::arg("strides"),
      py::arg("sketch_k") = kDefaultSketchK, py::arg("hist_bins") = kHistBins);

  // For tests: what record_packed() makes of one row (None if it rejects it).
  m.def(
      "unpack_row",
      [](F64Array row, int sketch_k, int hist_bins) -> py::object {
        TensorStats stats;
        if (row.ndim() != 1) return py::none();
        if (!UnpackRow(row.data(), static_cast<size_t>(row.shape(0)), sketch_k, hist_bins,
                       &stats)) {
          return py::none();
        }
        return StatsToDict(stats);
      },
      py::arg("row"), py::arg("sketch_k"), py::arg("hist_bins"));
}

}  // namespace lockstep::python
