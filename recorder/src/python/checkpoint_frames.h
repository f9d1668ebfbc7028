// Activation checkpointing's inputs from torch 2.12 on (capture/checkpoint_inputs.h): the
// frames whose save_inputs ran while followed, each with its CheckpointInputs.
#ifndef TORCHRR_RECORDER_CHECKPOINT_FRAMES_H_
#define TORCHRR_RECORDER_CHECKPOINT_FRAMES_H_

#include <Python.h>

#include "internals/torch_compat.h"

namespace torchrr::recorder::python {

// The CheckpointInputs of the checkpoint frame `frame`, or null when it was not followed. Holds
// the GIL.
compat::NodePtr FollowedCheckpointInputs(PyObject* frame);

}  // namespace torchrr::recorder::python

#endif  // TORCHRR_RECORDER_CHECKPOINT_FRAMES_H_
