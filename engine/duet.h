// The whole public API in one include.
#pragma once
#include "engine/allocator.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/functional.h"
#include "engine/op_params.h"
#include "engine/profiler/events.h"
#include "engine/tensor.h"
