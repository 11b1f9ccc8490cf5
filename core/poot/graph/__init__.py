"""The graph IR: typed tensors with symbolic shapes, the primitive op set, a builder, compositions and passes."""

from . import dtypes
from .attention import AttentionSpec
from .builder import GraphBuilder
from .dims import Dim, as_dim, sym
from .dtypes import DType, dtype_of, packed
from .ir import ConstData, Graph, Node, TensorType, Value
from .ops import OPS, OpDef
from .passes import PassManager, eliminate_common_subexpressions, eliminate_dead_code, fold_constants, infer_types, verify
from .rope import LinearScaling, Llama3Scaling, RopeConfig, YarnScaling, apply_rope, rope_frequencies

__all__ = [
    "dtypes",
    "AttentionSpec",
    "GraphBuilder",
    "Dim",
    "as_dim",
    "sym",
    "DType",
    "dtype_of",
    "packed",
    "ConstData",
    "Graph",
    "Node",
    "TensorType",
    "Value",
    "OPS",
    "OpDef",
    "PassManager",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fold_constants",
    "infer_types",
    "verify",
    "LinearScaling",
    "Llama3Scaling",
    "RopeConfig",
    "YarnScaling",
    "apply_rope",
    "rope_frequencies",
]
