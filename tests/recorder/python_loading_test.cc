// PythonInterpreterRunning() in a C++ program that loads Python after the recorder asked: the
// recorder asks at every forward op's end and does not look the symbol up again while no library
// was loaded since its last miss; a process that then loads and starts Python is seen at once.
#include <dlfcn.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "stacks/python_stacks.h"

namespace torchrr::recorder {
namespace {

TEST(PythonLoading, PythonLoadedAndStartedLaterIsSeen) {
  ASSERT_EQ(dlsym(RTLD_DEFAULT, "Py_IsInitialized"), nullptr) << "this test runs without Python";
  EXPECT_FALSE(PythonInterpreterRunning());
  EXPECT_FALSE(PythonInterpreterRunning());  // The miss remembered.

  const char* path = TORCHRR_TEST_LIBPYTHON;
  if (!std::filesystem::is_regular_file(path)) GTEST_SKIP() << "no shared libpython at " << path;
  void* library = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(library, nullptr) << dlerror();
  EXPECT_FALSE(PythonInterpreterRunning());  // Loaded, not initialized.

  auto* initialize = reinterpret_cast<void (*)(int)>(dlsym(library, "Py_InitializeEx"));
  ASSERT_NE(initialize, nullptr);
  initialize(0);
  EXPECT_TRUE(PythonInterpreterRunning());
  EXPECT_TRUE(PythonInterpreterRunning());
}

}  // namespace
}  // namespace torchrr::recorder
