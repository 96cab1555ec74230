/* pipeline.h - umbrella header of the pipeline SDK. Third-party plugins
 * include this one file. */
#ifndef PIPELINE_PIPELINE_H
#define PIPELINE_PIPELINE_H

#include "pipeline/status.h"
#include "pipeline/tensor.h"
#include "pipeline/alloc.h"
#include "pipeline/backend.h"
#include "pipeline/autograd.h"
#include "pipeline/ops.h"
#include "pipeline/config.h"
#include "pipeline/plugin.h"
#include "pipeline/safetensors.h"
#include "pipeline/nf4.h"
#include "pipeline/file.h"

#define PL_VERSION_STRING "0.1.0"

#endif
