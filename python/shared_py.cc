// ferry.alloc_shared(nbytes): shareable host memory (ferry::AllocateSharedHost) as a numpy
// uint8 array. Peers on this host reach memory registered inside it through the `shm`
// transport. The array owns the buffer: it is unmapped when the array and every view of it are
// gone (register_memory keeps the array alive while the region is registered).
#include <pybind11/numpy.h>

#include "binding.h"
#include "ferry/shared_memory.h"

namespace ferry::python {

void BindShared(py::module_& m) {
  m.def(
      "alloc_shared",
      [](int64_t nbytes) {
        if (nbytes <= 0) ThrowInvalid("alloc_shared needs a positive number of bytes");
        std::unique_ptr<HostBuffer> owned;
        {
          py::gil_scoped_release nogil;
          owned = std::make_unique<HostBuffer>(Unwrap(AllocateSharedHost(static_cast<uint64_t>(nbytes))));
        }
        auto* data = reinterpret_cast<uint8_t*>(owned->data());
        const auto size = static_cast<py::ssize_t>(owned->size());
        py::capsule keep(owned.release(), [](void* p) { delete static_cast<HostBuffer*>(p); });
        return py::array_t<uint8_t>({size}, {py::ssize_t{1}}, data, keep);
      },
      py::arg("nbytes"),
      "Zeroed host memory of `nbytes` that peers on this host can map (the shm transport), as a "
      "numpy uint8 array that owns it.");
}

}  // namespace ferry::python
