/* A C interface to the recorder, for bindings (the Python package loads it with ctypes into a
 * process where torch is already loaded). Every function is thread-safe and never fails loudly:
 * trouble prints one warning on stderr and the call returns a non-zero value. */
#ifndef TORCHRR_C_API_H_
#define TORCHRR_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Option flags for torchrr_start. */
#define TORCHRR_VERIFY_SAVED 1u     /* RecorderOptions::verify_saved: fingerprint saved tensors. */
#define TORCHRR_NO_CUDA_KERNELS 2u  /* RecorderOptions::cuda_kernels off: no CUPTI. */
#define TORCHRR_ALL_OPS 4u          /* RecorderOptions::all_ops: no op folded into another. */
#define TORCHRR_FOLLOW_FORKS 8u     /* RecorderOptions::follow_forks: a forked child records. */
#define TORCHRR_NO_SOURCE 16u       /* RecorderOptions::source off: no source lines in the trace. */

/* Starts recording into `path`. native_stacks, python_stacks: 0/1 (Python frames are captured
 * only in a process that runs Python, on threads with a Python thread state);
 * max_buffered_bytes: 0 for the default; drop_when_full: 0 waits for the writer, 1 drops and
 * writes a data-loss record; rank: -1 reads the RANK environment variable; flags: an OR of the
 * TORCHRR_* flags above (unknown bits are ignored). Returns 0 when recording, 1 otherwise
 * (already recording, or the file could not be opened: a warning says which). */
int torchrr_start(const char* path, int native_stacks, int python_stacks,
                  size_t max_buffered_bytes, int drop_when_full, int rank, uint32_t flags);

/* torchrr_start with RecorderOptions::keep_last_steps and keep_last_bytes (0: the default),
 * steps_first, steps_last (every step while steps_first > steps_last), and spill_dir (NULL or
 * empty: none). */
int torchrr_start_keeping(const char* path, int native_stacks, int python_stacks,
                          size_t max_buffered_bytes, int drop_when_full, int rank, uint32_t flags,
                          size_t keep_last_steps, size_t keep_last_bytes, uint64_t steps_first,
                          uint64_t steps_last, const char* spill_dir);

/* Marks the start of a training step in the active recording (Recorder::Step). */
void torchrr_step(void);

/* Starts recording as `torchrr record` asked through the environment: TORCHRR_OUTPUT (the trace;
 * FILE.rankN.trr when RANK=N is set), TORCHRR_NATIVE_STACKS, TORCHRR_PYTHON_STACKS,
 * TORCHRR_MAX_BUFFERED_BYTES, TORCHRR_WHEN_FULL (wait/drop), TORCHRR_VERIFY_SAVED,
 * TORCHRR_CUDA_KERNELS, TORCHRR_ALL_OPS, TORCHRR_FOLLOW_FORKS, TORCHRR_SOURCE (switches: 0/1). An unset variable
 * takes its default: RecorderOptions' (recorder.h), except C++ stacks, off when this process runs
 * a Python interpreter. Returns 0 when recording; 1 when TORCHRR_OUTPUT is unset or empty
 * (silently), already recording or the file could not be opened (a warning says which). A value
 * not understood prints a warning and takes the default. Reads the environment as getenv does:
 * not safe against a concurrent setenv. */
int torchrr_start_from_environment(void);

/* Stops the recording started by either function above and closes the trace; in a forked child
 * that follows (TORCHRR_FOLLOW_FORKS), the child's own recording. Returns 0, or 1 when nothing was
 * recording. */
int torchrr_stop(void);

/* 1 while a recording started by either function above records. */
int torchrr_recording(void);

/* Records an error (kind: 0 C++ exception, 1 Python exception, 2 uncaught) with its type name
 * and message into the active recording. No-op when nothing records. */
void torchrr_record_error(int kind, const char* type, const char* message);

/* Ops recorded so far by the active recording. */
uint64_t torchrr_ops_recorded(void);

/* How Python stacks are read in this process: "frames" (the interpreter's frames read directly:
 * CPython 3.11, while they agree with the API's) or "api" (through frame objects, under the GIL).
 * A diagnostic: both give the same stacks. */
const char* torchrr_python_stack_walker(void);

#ifdef __cplusplus
}
#endif

#endif /* TORCHRR_C_API_H_ */
