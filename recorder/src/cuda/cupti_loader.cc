// Loading libcupti: the one the process already has beside its libcudart, else the toolkit's.
#include "cuda/cupti_tracer.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <limits>
#include <mutex>
#include <utility>

#if TORCHRR_HAVE_CUPTI
#include <cuda.h>
#include <cupti.h>

#include "cuda/cupti_layouts.h"
#endif

#include "cuda/cupti_values.h"

namespace torchrr::recorder {

using cupti::kSuccess;

#if TORCHRR_HAVE_CUPTI
namespace {

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// Directories of the libcudart and libcupti already loaded in the process.
std::vector<std::string> LoadedCudaDirectories() {
  std::vector<std::string> dirs;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
        try {
          std::string path = info->dlpi_name;
          std::string base = path.substr(path.rfind('/') + 1);
          if (base.rfind("libcudart.so", 0) == 0 || base.rfind("libcupti.so", 0) == 0) {
            static_cast<std::vector<std::string>*>(data)->push_back(Dirname(path));
          }
        } catch (...) {
          return 1;  // Out of memory: stop walking; what was found is still tried.
        }
        return 0;
      },
      &dirs);
  return dirs;
}

struct Loaded {
  bool ok = false;
  CuptiApi api;
  std::string why_not;
};

template <typename F>
bool Symbol(void* handle, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr && missing->empty()) *missing = name;
  return *out != nullptr;
}

// Fills `api` from an opened libcupti; returns "" or why it will not do.
std::string Bind(void* handle, const std::string& path, CuptiApi* api) {
  std::string missing;
  Symbol(handle, "cuptiGetVersion", &api->GetVersion, &missing);
  Symbol(handle, "cuptiGetResultString", &api->GetResultString, &missing);
  Symbol(handle, "cuptiGetTimestamp", &api->GetTimestamp, &missing);
  Symbol(handle, "cuptiActivityEnable", &api->ActivityEnable, &missing);
  Symbol(handle, "cuptiActivityDisable", &api->ActivityDisable, &missing);
  Symbol(handle, "cuptiActivityRegisterCallbacks", &api->ActivityRegisterCallbacks, &missing);
  Symbol(handle, "cuptiActivityFlushAll", &api->ActivityFlushAll, &missing);
  Symbol(handle, "cuptiActivityGetNextRecord", &api->ActivityGetNextRecord, &missing);
  Symbol(handle, "cuptiActivityGetNumDroppedRecords", &api->ActivityGetNumDroppedRecords,
         &missing);
  Symbol(handle, "cuptiActivityPushExternalCorrelationId", &api->ActivityPushExternalCorrelationId,
         &missing);
  Symbol(handle, "cuptiActivityPopExternalCorrelationId", &api->ActivityPopExternalCorrelationId,
         &missing);
  if (!missing.empty()) return path + " lacks " + missing;
  uint32_t version = 0;
  CuptiApi::Result result = api->GetVersion(&version);
  if (result != kSuccess) {
    return path + ": cuptiGetVersion failed (error " + std::to_string(result) + ")";
  }
  if (version < kMinCuptiVersion) {
    return path + " is CUPTI API version " + std::to_string(version) + ", older than the " +
           std::to_string(CUPTI_API_VERSION) +
           " of the cupti.h torchrr was built with (its records would be misread)";
  }
  return "";
}

Loaded Load() {
  Loaded loaded;
  const std::string soname = "libcupti.so." + std::to_string(CUDA_VERSION / 1000);
  std::vector<std::string> candidates = {soname, "libcupti.so"};
  for (const std::string& dir : LoadedCudaDirectories()) {
    candidates.push_back(dir + "/" + soname);
    candidates.push_back(dir + "/libcupti.so");
  }
  candidates.push_back("/usr/local/cuda/lib64/" + soname);
  candidates.push_back("/usr/local/cuda/extras/CUPTI/lib64/" + soname);

  std::string first_error;
  for (const std::string& candidate : candidates) {
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      if (first_error.empty()) {
        const char* error = dlerror();
        first_error = error ? error : candidate + ": cannot be loaded";
      }
      continue;
    }
    std::string path = candidate;
    if (void* any = dlsym(handle, "cuptiGetVersion")) {
      Dl_info info;
      if (dladdr(any, &info) != 0 && info.dli_fname != nullptr) path = info.dli_fname;
    }
    CuptiApi api;
    std::string why = Bind(handle, path, &api);
    if (why.empty()) {
      loaded.ok = true;
      loaded.api = api;
      return loaded;  // Never dlclose()d: see LoadCupti().
    }
    dlclose(handle);  // Nothing of it was used.
    if (loaded.why_not.empty()) loaded.why_not = why;
  }
  if (loaded.why_not.empty()) loaded.why_not = "no libcupti could be loaded (" + first_error + ")";
  return loaded;
}

}  // namespace

bool LoadCupti(CuptiApi* api, std::string* why_not) {
  static const Loaded loaded = [] {
    try {
      return Load();
    } catch (const std::exception& e) {
      Loaded failed;
      failed.why_not = std::string("loading libcupti: ") + e.what();
      return failed;
    }
  }();
  if (loaded.ok) {
    *api = loaded.api;
  } else if (why_not != nullptr) {
    *why_not = loaded.why_not;
  }
  return loaded.ok;
}

#else  // !TORCHRR_HAVE_CUPTI

bool LoadCupti(CuptiApi*, std::string* why_not) {
  if (why_not != nullptr) {
    *why_not = "unavailable: torchrr was built without CUPTI's headers (cupti.h)";
  }
  return false;
}

#endif  // TORCHRR_HAVE_CUPTI

}  // namespace torchrr::recorder
