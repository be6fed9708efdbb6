//! A StableHLO text builder: enough ops for a training step (elementwise math, compare/select,
//! convert, broadcast, reshape, transpose, dot_general, reduce, while) and for replicated
//! programs (replica_id, all_reduce, all_gather, all_to_all), emitted as one MLIR module whose
//! `mhlo.num_replicas` / `mhlo.num_partitions` attributes the compiler reads.
//!
//! Ops are printed in MLIR's generic form (`"stablehlo.add"(%a, %b) : (…) -> …`), which every
//! StableHLO version parses, instead of each op's pretty syntax, which changes between versions.
//! The builder checks shapes as it goes, so a mistake is reported at the op that makes it, not as
//! a compiler message about the whole module.
//!
//! ```
//! use distribute_pjrt::stablehlo::{AllReduceOp, Builder, ReplicaGroups, TensorType};
//! use distribute_pjrt::ElementType;
//!
//! let mut b = Builder::new();
//! let x = b.parameter(TensorType::new(ElementType::F32, &[4]));
//! let sum = b.all_reduce(&x, AllReduceOp::Sum, &ReplicaGroups::all(2)).unwrap();
//! let module = b.build("sum", &[sum], 2).unwrap();
//! assert!(module.text().contains("mhlo.num_replicas = 2 : i32"));
//! ```

use std::fmt::{self, Write as _};

use crate::error::{PjrtError, Result};
use crate::options::CompileOptions;
use crate::types::{ElementType, NativeType};

/// The type of a tensor value: element type and static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub element: ElementType,
    /// Dimensions, outermost first; empty for a scalar.
    pub dims: Vec<i64>,
}

impl TensorType {
    /// A tensor type of `element`s with shape `dims`.
    pub fn new(element: ElementType, dims: &[i64]) -> TensorType {
        TensorType {
            element,
            dims: dims.to_vec(),
        }
    }

    /// A scalar of `element`.
    pub fn scalar(element: ElementType) -> TensorType {
        TensorType::new(element, &[])
    }

    /// Number of elements.
    pub fn element_count(&self) -> i64 {
        self.dims.iter().product()
    }

    fn with_element(&self, element: ElementType) -> TensorType {
        TensorType::new(element, &self.dims)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.element)
    }
}

/// An SSA value of the program being built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    name: String,
    ty: TensorType,
}

impl Value {
    /// Its type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }
}

/// Elementwise binary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Subtract,
    /// `a * b`
    Multiply,
    /// `a / b`
    Divide,
    /// `max(a, b)`
    Maximum,
    /// `min(a, b)`
    Minimum,
    /// `a ^ b`
    Power,
    /// `a % b` (sign of `a`)
    Remainder,
    /// Bitwise / logical and.
    And,
    /// Bitwise / logical or.
    Or,
}

impl BinaryOp {
    fn op_name(self) -> &'static str {
        match self {
            BinaryOp::Add => "stablehlo.add",
            BinaryOp::Subtract => "stablehlo.subtract",
            BinaryOp::Multiply => "stablehlo.multiply",
            BinaryOp::Divide => "stablehlo.divide",
            BinaryOp::Maximum => "stablehlo.maximum",
            BinaryOp::Minimum => "stablehlo.minimum",
            BinaryOp::Power => "stablehlo.power",
            BinaryOp::Remainder => "stablehlo.remainder",
            BinaryOp::And => "stablehlo.and",
            BinaryOp::Or => "stablehlo.or",
        }
    }
}

/// Elementwise unary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// `-x`
    Negate,
    /// `|x|`
    Abs,
    /// `e^x`
    Exp,
    /// `ln x`
    Log,
    /// `√x`
    Sqrt,
    /// `1/√x`
    Rsqrt,
    /// `tanh x`
    Tanh,
    /// `1 / (1 + e^-x)`
    Logistic,
}

impl UnaryOp {
    fn op_name(self) -> &'static str {
        match self {
            UnaryOp::Negate => "stablehlo.negate",
            UnaryOp::Abs => "stablehlo.abs",
            UnaryOp::Exp => "stablehlo.exponential",
            UnaryOp::Log => "stablehlo.log",
            UnaryOp::Sqrt => "stablehlo.sqrt",
            UnaryOp::Rsqrt => "stablehlo.rsqrt",
            UnaryOp::Tanh => "stablehlo.tanh",
            UnaryOp::Logistic => "stablehlo.logistic",
        }
    }
}

/// Comparison directions for [`Builder::compare`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Comparison {
    fn keyword(self) -> &'static str {
        match self {
            Comparison::Eq => "EQ",
            Comparison::Ne => "NE",
            Comparison::Lt => "LT",
            Comparison::Le => "LE",
            Comparison::Gt => "GT",
            Comparison::Ge => "GE",
        }
    }
}

/// How [`Builder::reduce`] combines elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// Sum.
    Sum,
    /// Product.
    Product,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

impl Reduction {
    fn combiner(self) -> BinaryOp {
        match self {
            Reduction::Sum => BinaryOp::Add,
            Reduction::Product => BinaryOp::Multiply,
            Reduction::Min => BinaryOp::Minimum,
            Reduction::Max => BinaryOp::Maximum,
        }
    }
}

/// How [`Builder::all_reduce`] combines the replicas' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduceOp {
    /// Sum over the group.
    Sum,
    /// Sum over the group divided by the group's size (floating-point types only).
    Mean,
    /// Minimum over the group.
    Min,
    /// Maximum over the group.
    Max,
}

/// Which replicas communicate in a collective: disjoint groups of equal size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaGroups {
    groups: Vec<Vec<u32>>,
}

impl ReplicaGroups {
    /// One group of replicas `0..n`.
    pub fn all(n: u32) -> ReplicaGroups {
        ReplicaGroups {
            groups: vec![(0..n).collect()],
        }
    }

    /// Explicit groups; they must be non-empty, of equal size, and not share a replica.
    pub fn new(groups: Vec<Vec<u32>>) -> Result<ReplicaGroups> {
        let size = groups.first().map_or(0, Vec::len);
        if size == 0 || groups.iter().any(|g| g.len() != size) {
            return Err(PjrtError::InvalidArgument(format!(
                "replica groups {groups:?} must be non-empty and of equal size"
            )));
        }
        let mut seen: Vec<u32> = groups.iter().flatten().copied().collect();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(PjrtError::InvalidArgument(format!(
                "replica groups {groups:?} name a replica twice"
            )));
        }
        Ok(ReplicaGroups { groups })
    }

    /// Replicas per group.
    pub fn group_size(&self) -> usize {
        self.groups[0].len()
    }

    fn attribute(&self) -> String {
        let rows: Vec<String> = self
            .groups
            .iter()
            .map(|g| {
                let ids: Vec<String> = g.iter().map(u32::to_string).collect();
                format!("[{}]", ids.join(", "))
            })
            .collect();
        format!(
            "dense<[{}]> : tensor<{}x{}xi64>",
            rows.join(", "),
            self.groups.len(),
            self.group_size()
        )
    }
}

/// Dimension numbers of [`Builder::dot_general`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DotDims {
    /// Batch dimensions of the left operand.
    pub lhs_batch: Vec<i64>,
    /// Batch dimensions of the right operand (paired with `lhs_batch`).
    pub rhs_batch: Vec<i64>,
    /// Contracted dimensions of the left operand.
    pub lhs_contracting: Vec<i64>,
    /// Contracted dimensions of the right operand (paired with `lhs_contracting`).
    pub rhs_contracting: Vec<i64>,
}

/// A finished module: StableHLO text plus the replica count it was built for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    text: String,
    num_replicas: u32,
}

impl Module {
    /// The MLIR text, for [`crate::Client::compile`].
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The replica count written into the module.
    pub fn num_replicas(&self) -> u32 {
        self.num_replicas
    }

    /// Compile options matching the module's attributes.
    pub fn compile_options(&self) -> CompileOptions {
        CompileOptions::replicated(self.num_replicas)
    }
}

/// Builds one function, `main`, op by op. Values are checked for shape as they are combined.
#[derive(Debug, Default)]
pub struct Builder {
    parameters: Vec<TensorType>,
    /// Lines of the region being built (the function body, or a nested region).
    lines: Vec<String>,
    next_id: usize,
    /// Nesting depth: parameters may only be added at depth 0.
    depth: usize,
}

impl Builder {
    /// An empty function.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Adds the next parameter of `main`.
    pub fn parameter(&mut self, ty: TensorType) -> Value {
        let name = format!("%arg{}", self.parameters.len());
        self.parameters.push(ty.clone());
        Value { name, ty }
    }

    fn fresh(&mut self) -> String {
        let name = format!("%{}", self.next_id);
        self.next_id += 1;
        name
    }

    /// Emits `%r = "op"(operands) attrs regions : (types) -> result` and returns `%r`.
    fn op(&mut self, op: &str, operands: &[&Value], attributes: &str, result: TensorType) -> Value {
        let name = self.fresh();
        let line = format!(
            "{name} = \"{op}\"({}){} : ({}) -> {result}",
            names(operands),
            attributes,
            types(operands)
        );
        self.lines.push(line);
        Value { name, ty: result }
    }

    /// A dense constant of shape `dims` holding `values` (row-major).
    pub fn constant<T: NativeType>(&mut self, values: &[T], dims: &[i64]) -> Result<Value> {
        let ty = TensorType::new(T::TYPE, dims);
        if usize::try_from(ty.element_count()).ok() != Some(values.len()) {
            return Err(PjrtError::InvalidArgument(format!(
                "constant of shape {dims:?} needs {} values, got {}",
                ty.element_count(),
                values.len()
            )));
        }
        let body = if dims.is_empty() {
            values[0].mlir_literal()
        } else {
            nested_literal(values, dims)
        };
        Ok(self.op(
            "stablehlo.constant",
            &[],
            &format!(" {{value = dense<{body}> : {ty}}}"),
            ty,
        ))
    }

    /// A constant of shape `dims` with every element `value`.
    pub fn splat<T: NativeType>(&mut self, value: T, dims: &[i64]) -> Value {
        let ty = TensorType::new(T::TYPE, dims);
        let literal = value.mlir_literal();
        self.op(
            "stablehlo.constant",
            &[],
            &format!(" {{value = dense<{literal}> : {ty}}}"),
            ty,
        )
    }

    /// A scalar constant.
    pub fn scalar<T: NativeType>(&mut self, value: T) -> Value {
        self.splat(value, &[])
    }

    /// An elementwise binary op; both operands must have the same type.
    pub fn binary(&mut self, op: BinaryOp, a: &Value, b: &Value) -> Result<Value> {
        same_type(op.op_name(), a, b)?;
        Ok(self.op(op.op_name(), &[a, b], "", a.ty.clone()))
    }

    /// `a + b`
    pub fn add(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary(BinaryOp::Add, a, b)
    }

    /// `a - b`
    pub fn subtract(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary(BinaryOp::Subtract, a, b)
    }

    /// `a * b`
    pub fn multiply(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary(BinaryOp::Multiply, a, b)
    }

    /// `a / b`
    pub fn divide(&mut self, a: &Value, b: &Value) -> Result<Value> {
        self.binary(BinaryOp::Divide, a, b)
    }

    /// An elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: &Value) -> Value {
        self.op(op.op_name(), &[x], "", x.ty.clone())
    }

    /// Elementwise comparison; the result is a boolean tensor of the operands' shape.
    pub fn compare(&mut self, direction: Comparison, a: &Value, b: &Value) -> Result<Value> {
        same_type("stablehlo.compare", a, b)?;
        let attributes = format!(
            " {{comparison_direction = #stablehlo<comparison_direction {}>}}",
            direction.keyword()
        );
        let result = a.ty.with_element(ElementType::Pred);
        Ok(self.op("stablehlo.compare", &[a, b], &attributes, result))
    }

    /// `pred ? on_true : on_false`, elementwise (or with a scalar `pred` for the whole tensor).
    pub fn select(&mut self, pred: &Value, on_true: &Value, on_false: &Value) -> Result<Value> {
        same_type("stablehlo.select", on_true, on_false)?;
        if pred.ty.element != ElementType::Pred
            || !(pred.ty.dims.is_empty() || pred.ty.dims == on_true.ty.dims)
        {
            return Err(PjrtError::InvalidArgument(format!(
                "stablehlo.select: the predicate must be i1 of shape {:?} or a scalar, got {}",
                on_true.ty.dims, pred.ty
            )));
        }
        Ok(self.op(
            "stablehlo.select",
            &[pred, on_true, on_false],
            "",
            on_true.ty.clone(),
        ))
    }

    /// Converts elements to `element`.
    pub fn convert(&mut self, x: &Value, element: ElementType) -> Value {
        self.op("stablehlo.convert", &[x], "", x.ty.with_element(element))
    }

    /// Broadcasts `x` to `dims`: operand dimension `i` becomes result dimension
    /// `broadcast_dimensions[i]` (of equal size, or size 1 to repeat).
    pub fn broadcast_in_dim(
        &mut self,
        x: &Value,
        dims: &[i64],
        broadcast_dimensions: &[i64],
    ) -> Result<Value> {
        let valid = broadcast_dimensions.len() == x.ty.dims.len()
            && broadcast_dimensions
                .iter()
                .zip(&x.ty.dims)
                .all(|(&to, &size)| {
                    usize::try_from(to)
                        .ok()
                        .and_then(|to| dims.get(to))
                        .is_some_and(|&target| size == 1 || size == target)
                });
        if !valid {
            return Err(PjrtError::InvalidArgument(format!(
                "stablehlo.broadcast_in_dim: cannot broadcast {} to {dims:?} along {broadcast_dimensions:?}; \
                 give one result dimension per operand dimension, of the same size or with the \
                 operand's size 1",
                x.ty
            )));
        }
        let attributes = format!(
            " {{broadcast_dimensions = {}}}",
            i64_array(broadcast_dimensions)
        );
        let result = TensorType::new(x.ty.element, dims);
        Ok(self.op("stablehlo.broadcast_in_dim", &[x], &attributes, result))
    }

    /// Reshapes `x` to `dims` (same element count).
    pub fn reshape(&mut self, x: &Value, dims: &[i64]) -> Result<Value> {
        let result = TensorType::new(x.ty.element, dims);
        if result.element_count() != x.ty.element_count() {
            return Err(PjrtError::InvalidArgument(format!(
                "stablehlo.reshape: {} has {} elements, shape {dims:?} has {}",
                x.ty,
                x.ty.element_count(),
                result.element_count()
            )));
        }
        Ok(self.op("stablehlo.reshape", &[x], "", result))
    }

    /// Permutes the dimensions of `x`: result dimension `i` is operand dimension
    /// `permutation[i]`.
    pub fn transpose(&mut self, x: &Value, permutation: &[i64]) -> Result<Value> {
        let mut sorted = permutation.to_vec();
        sorted.sort_unstable();
        if sorted != (0..x.ty.dims.len() as i64).collect::<Vec<_>>() {
            return Err(PjrtError::InvalidArgument(format!(
                "stablehlo.transpose: {permutation:?} is not a permutation of {}'s dimensions",
                x.ty
            )));
        }
        let dims: Vec<i64> = permutation.iter().map(|&p| x.ty.dims[p as usize]).collect();
        let attributes = format!(" {{permutation = {}}}", i64_array(permutation));
        Ok(self.op(
            "stablehlo.transpose",
            &[x],
            &attributes,
            TensorType::new(x.ty.element, &dims),
        ))
    }

    /// General dot product. The result's dimensions are the batch dimensions, then the left
    /// operand's free dimensions, then the right operand's.
    pub fn dot_general(&mut self, lhs: &Value, rhs: &Value, dims: &DotDims) -> Result<Value> {
        let err = |why: &str| {
            PjrtError::InvalidArgument(format!(
                "stablehlo.dot_general of {} and {} with {dims:?}: {why}",
                lhs.ty, rhs.ty
            ))
        };
        if lhs.ty.element != rhs.ty.element {
            return Err(err("the element types differ"));
        }
        if dims.lhs_batch.len() != dims.rhs_batch.len()
            || dims.lhs_contracting.len() != dims.rhs_contracting.len()
        {
            return Err(err("batch and contracting dimensions must come in pairs"));
        }
        let size = |ty: &TensorType, d: i64| {
            usize::try_from(d)
                .ok()
                .and_then(|d| ty.dims.get(d).copied())
        };
        for (l, r) in dims
            .lhs_batch
            .iter()
            .zip(&dims.rhs_batch)
            .chain(dims.lhs_contracting.iter().zip(&dims.rhs_contracting))
        {
            match (size(&lhs.ty, *l), size(&rhs.ty, *r)) {
                (Some(a), Some(b)) if a == b => {}
                _ => return Err(err("paired dimensions must exist and have equal sizes")),
            }
        }
        let free = |ty: &TensorType, batch: &[i64], contracting: &[i64]| -> Vec<i64> {
            (0..ty.dims.len() as i64)
                .filter(|d| !batch.contains(d) && !contracting.contains(d))
                .map(|d| ty.dims[d as usize])
                .collect()
        };
        let mut result: Vec<i64> = dims
            .lhs_batch
            .iter()
            .map(|&d| lhs.ty.dims[d as usize])
            .collect();
        result.extend(free(&lhs.ty, &dims.lhs_batch, &dims.lhs_contracting));
        result.extend(free(&rhs.ty, &dims.rhs_batch, &dims.rhs_contracting));
        let mut fields = Vec::new();
        for (name, list) in [
            ("lhs_batching_dimensions", &dims.lhs_batch),
            ("rhs_batching_dimensions", &dims.rhs_batch),
            ("lhs_contracting_dimensions", &dims.lhs_contracting),
            ("rhs_contracting_dimensions", &dims.rhs_contracting),
        ] {
            if !list.is_empty() {
                let items: Vec<String> = list.iter().map(i64::to_string).collect();
                fields.push(format!("{name} = [{}]", items.join(", ")));
            }
        }
        let attributes = format!(
            " {{dot_dimension_numbers = #stablehlo.dot<{}>}}",
            fields.join(", ")
        );
        Ok(self.op(
            "stablehlo.dot_general",
            &[lhs, rhs],
            &attributes,
            TensorType::new(lhs.ty.element, &result),
        ))
    }

    /// Matrix product of `[m, k]` and `[k, n]` (or matrix–vector with a `[k]` right operand).
    pub fn matmul(&mut self, lhs: &Value, rhs: &Value) -> Result<Value> {
        let dims = DotDims {
            lhs_contracting: vec![lhs.ty.dims.len() as i64 - 1],
            rhs_contracting: vec![0],
            ..DotDims::default()
        };
        self.dot_general(lhs, rhs, &dims)
    }

    /// The block of `x` of shape `sizes` starting at `start` (one integer scalar per dimension,
    /// clamped by the op so that the block stays inside `x`).
    pub fn dynamic_slice(&mut self, x: &Value, start: &[&Value], sizes: &[i64]) -> Result<Value> {
        let rank = x.ty.dims.len();
        let valid = start.len() == rank
            && sizes.len() == rank
            && sizes
                .iter()
                .zip(&x.ty.dims)
                .all(|(s, d)| (0..=*d).contains(s))
            && start.iter().all(|v| {
                v.ty.dims.is_empty() && matches!(v.ty.element, ElementType::S32 | ElementType::S64)
            });
        if !valid {
            return Err(PjrtError::InvalidArgument(format!(
                "stablehlo.dynamic_slice of {}: give one integer scalar start and one size (at \
                 most the dimension) per dimension, got {} starts and sizes {sizes:?}",
                x.ty,
                start.len()
            )));
        }
        let mut operands = vec![x];
        operands.extend_from_slice(start);
        let attributes = format!(" {{slice_sizes = {}}}", i64_array(sizes));
        Ok(self.op(
            "stablehlo.dynamic_slice",
            &operands,
            &attributes,
            TensorType::new(x.ty.element, sizes),
        ))
    }

    /// A region `^bb0(args): body; return results` at the current depth, as text.
    fn region(
        &mut self,
        arg_types: &[TensorType],
        body: impl FnOnce(&mut Builder, &[Value]) -> Result<Vec<Value>>,
    ) -> Result<(String, Vec<TensorType>)> {
        let outer = std::mem::take(&mut self.lines);
        self.depth += 1;
        let args: Vec<Value> = arg_types
            .iter()
            .map(|ty| Value {
                name: self.fresh(),
                ty: ty.clone(),
            })
            .collect();
        let results = body(self, &args);
        self.depth -= 1;
        let inner = std::mem::replace(&mut self.lines, outer);
        let results = results?;
        let result_refs: Vec<&Value> = results.iter().collect();
        let mut text = String::from("{\n");
        let params: Vec<String> = args
            .iter()
            .map(|a| format!("{}: {}", a.name, a.ty))
            .collect();
        let _ = writeln!(text, "^bb0({}):", params.join(", "));
        for line in inner.iter().flat_map(|l| l.lines()) {
            let _ = writeln!(text, "  {line}");
        }
        let _ = writeln!(
            text,
            "  \"stablehlo.return\"({}) : ({}) -> ()",
            names(&result_refs),
            types(&result_refs)
        );
        text.push('}');
        Ok((text, results.into_iter().map(|v| v.ty).collect()))
    }

    /// A scalar combiner region `(a, b) -> op(a, b)` for reduce and all_reduce.
    fn combiner(&mut self, element: ElementType, op: BinaryOp) -> Result<String> {
        let scalar = TensorType::scalar(element);
        let (text, _) = self.region(&[scalar.clone(), scalar], |b, args| {
            Ok(vec![b.binary(op, &args[0], &args[1])?])
        })?;
        Ok(text)
    }

    /// Reduces `x` over `dimensions` starting from the scalar `init`.
    pub fn reduce(
        &mut self,
        x: &Value,
        init: &Value,
        dimensions: &[i64],
        how: Reduction,
    ) -> Result<Value> {
        if init.ty != TensorType::scalar(x.ty.element) {
            return Err(PjrtError::InvalidArgument(format!(
                "stablehlo.reduce: the initial value must be a {} scalar, got {}",
                x.ty.element, init.ty
            )));
        }
        let rank = x.ty.dims.len() as i64;
        if dimensions.iter().any(|d| !(0..rank).contains(d)) {
            return Err(PjrtError::InvalidArgument(format!(
                "stablehlo.reduce: dimensions {dimensions:?} out of range for {}",
                x.ty
            )));
        }
        let kept: Vec<i64> = (0..rank)
            .filter(|d| !dimensions.contains(d))
            .map(|d| x.ty.dims[d as usize])
            .collect();
        let region = self.combiner(x.ty.element, how.combiner())?;
        let attributes = format!(" ({region}) {{dimensions = {}}}", i64_array(dimensions));
        Ok(self.op(
            "stablehlo.reduce",
            &[x, init],
            &attributes,
            TensorType::new(x.ty.element, &kept),
        ))
    }

    /// This replica's index, a `ui32` scalar.
    pub fn replica_id(&mut self) -> Value {
        self.op(
            "stablehlo.replica_id",
            &[],
            "",
            TensorType::scalar(ElementType::U32),
        )
    }

    /// Combines `x` across the replicas of each group; every member gets the result.
    pub fn all_reduce(
        &mut self,
        x: &Value,
        op: AllReduceOp,
        groups: &ReplicaGroups,
    ) -> Result<Value> {
        let combiner = match op {
            AllReduceOp::Sum | AllReduceOp::Mean => BinaryOp::Add,
            AllReduceOp::Min => BinaryOp::Minimum,
            AllReduceOp::Max => BinaryOp::Maximum,
        };
        if op == AllReduceOp::Mean && !x.ty.element.is_float() {
            return Err(PjrtError::InvalidArgument(format!(
                "all_reduce Mean of {}: a mean needs a floating-point type; convert first or use Sum",
                x.ty
            )));
        }
        let region = self.combiner(x.ty.element, combiner)?;
        let attributes = format!(" ({region}) {{replica_groups = {}}}", groups.attribute());
        let sum = self.op("stablehlo.all_reduce", &[x], &attributes, x.ty.clone());
        if op != AllReduceOp::Mean {
            return Ok(sum);
        }
        let count = self.group_size_constant(x.ty.element, groups.group_size())?;
        let count = self.broadcast_in_dim(&count, &x.ty.dims, &[])?;
        self.divide(&sum, &count)
    }

    fn group_size_constant(&mut self, element: ElementType, size: usize) -> Result<Value> {
        let ty = TensorType::scalar(element);
        // Group sizes are small integers, exact in every float type.
        Ok(self.op(
            "stablehlo.constant",
            &[],
            &format!(" {{value = dense<{size}.0> : {ty}}}"),
            ty,
        ))
    }

    /// Concatenates the group's values of `x` along `dimension`, in replica order.
    pub fn all_gather(
        &mut self,
        x: &Value,
        dimension: i64,
        groups: &ReplicaGroups,
    ) -> Result<Value> {
        let mut dims = x.ty.dims.clone();
        let Some(d) = usize::try_from(dimension)
            .ok()
            .and_then(|d| dims.get_mut(d))
        else {
            return Err(PjrtError::InvalidArgument(format!(
                "all_gather: dimension {dimension} out of range for {}",
                x.ty
            )));
        };
        *d *= groups.group_size() as i64;
        let attributes = format!(
            " {{all_gather_dim = {dimension} : i64, replica_groups = {}}}",
            groups.attribute()
        );
        Ok(self.op(
            "stablehlo.all_gather",
            &[x],
            &attributes,
            TensorType::new(x.ty.element, &dims),
        ))
    }

    /// Splits `x` along `split_dimension` into one block per group member, sends block `i` to
    /// member `i`, and concatenates the received blocks along `concat_dimension`.
    pub fn all_to_all(
        &mut self,
        x: &Value,
        split_dimension: i64,
        concat_dimension: i64,
        groups: &ReplicaGroups,
    ) -> Result<Value> {
        let count = groups.group_size() as i64;
        let rank = x.ty.dims.len() as i64;
        if !(0..rank).contains(&split_dimension)
            || !(0..rank).contains(&concat_dimension)
            || x.ty.dims[split_dimension as usize] % count != 0
        {
            return Err(PjrtError::InvalidArgument(format!(
                "all_to_all of {}: split dimension {split_dimension} must exist and divide by the \
                 group size {count}, concat dimension {concat_dimension} must exist",
                x.ty
            )));
        }
        let mut dims = x.ty.dims.clone();
        dims[split_dimension as usize] /= count;
        dims[concat_dimension as usize] *= count;
        let attributes = format!(
            " {{concat_dimension = {concat_dimension} : i64, replica_groups = {}, \
             split_count = {count} : i64, split_dimension = {split_dimension} : i64}}",
            groups.attribute()
        );
        Ok(self.op(
            "stablehlo.all_to_all",
            &[x],
            &attributes,
            TensorType::new(x.ty.element, &dims),
        ))
    }

    /// A while loop over the carried values `init`: `cond` maps them to an `i1` scalar, `body`
    /// to their next values (same types). Returns the final values. Regions see only their
    /// arguments: pass what the body needs as carried values.
    pub fn while_loop(
        &mut self,
        init: &[&Value],
        cond: impl FnOnce(&mut Builder, &[Value]) -> Result<Value>,
        body: impl FnOnce(&mut Builder, &[Value]) -> Result<Vec<Value>>,
    ) -> Result<Vec<Value>> {
        let types_in: Vec<TensorType> = init.iter().map(|v| v.ty.clone()).collect();
        let (cond_text, cond_types) = self.region(&types_in, |b, args| Ok(vec![cond(b, args)?]))?;
        if cond_types != [TensorType::scalar(ElementType::Pred)] {
            return Err(PjrtError::InvalidArgument(format!(
                "stablehlo.while: the condition must return an i1 scalar, got {cond_types:?}"
            )));
        }
        let (body_text, body_types) = self.region(&types_in, body)?;
        if body_types != types_in {
            return Err(PjrtError::InvalidArgument(format!(
                "stablehlo.while: the body must return the carried types {types_in:?}, got {body_types:?}"
            )));
        }
        let name = self.fresh();
        let result_types: Vec<String> = types_in.iter().map(ToString::to_string).collect();
        self.lines.push(format!(
            "{name}:{} = \"stablehlo.while\"({}) ({cond_text}, {body_text}) : ({}) -> ({})",
            init.len(),
            names(init),
            types(init),
            result_types.join(", ")
        ));
        Ok(types_in
            .into_iter()
            .enumerate()
            .map(|(i, ty)| Value {
                name: format!("{name}#{i}"),
                ty,
            })
            .collect())
    }

    /// Finishes `main` returning `outputs`, in a module named `name` for `num_replicas`
    /// replicas.
    pub fn build(self, name: &str, outputs: &[Value], num_replicas: u32) -> Result<Module> {
        if num_replicas == 0 {
            return Err(PjrtError::InvalidArgument(
                "a module needs at least one replica".to_owned(),
            ));
        }
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || name.is_empty() {
            return Err(PjrtError::InvalidArgument(format!(
                "module name '{name}' must be non-empty ASCII letters, digits or '_'"
            )));
        }
        let output_refs: Vec<&Value> = outputs.iter().collect();
        let params: Vec<String> = self
            .parameters
            .iter()
            .enumerate()
            .map(|(i, ty)| format!("%arg{i}: {ty}"))
            .collect();
        let mut text = String::new();
        let _ = writeln!(
            text,
            "module @{name} attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = {num_replicas} : i32}} {{"
        );
        let _ = writeln!(
            text,
            "  func.func public @main({}) -> ({}) {{",
            params.join(", "),
            types(&output_refs)
        );
        for line in &self.lines {
            for part in line.lines() {
                let _ = writeln!(text, "    {part}");
            }
        }
        let _ = writeln!(
            text,
            "    func.return {} : {}",
            names(&output_refs),
            types(&output_refs)
        );
        text.push_str("  }\n}\n");
        Ok(Module { text, num_replicas })
    }
}

fn names(values: &[&Value]) -> String {
    let names: Vec<&str> = values.iter().map(|v| v.name.as_str()).collect();
    names.join(", ")
}

fn types(values: &[&Value]) -> String {
    let types: Vec<String> = values.iter().map(|v| v.ty.to_string()).collect();
    types.join(", ")
}

fn same_type(op: &str, a: &Value, b: &Value) -> Result<()> {
    if a.ty == b.ty {
        Ok(())
    } else {
        Err(PjrtError::InvalidArgument(format!(
            "{op}: operand types differ ({} vs {}); broadcast or convert one of them first",
            a.ty, b.ty
        )))
    }
}

fn i64_array(values: &[i64]) -> String {
    if values.is_empty() {
        return "array<i64>".to_owned();
    }
    let items: Vec<String> = values.iter().map(i64::to_string).collect();
    format!("array<i64: {}>", items.join(", "))
}

/// `[[1.0, 2.0], [3.0, 4.0]]` for a row-major array of shape `dims`.
fn nested_literal<T: NativeType>(values: &[T], dims: &[i64]) -> String {
    match dims {
        [] => values[0].mlir_literal(),
        [_] => {
            let items: Vec<String> = values.iter().map(|v| v.mlir_literal()).collect();
            format!("[{}]", items.join(", "))
        }
        [outer, rest @ ..] => {
            let chunk = values.len() / (*outer).max(1) as usize;
            let rows: Vec<String> = if chunk == 0 {
                Vec::new()
            } else {
                values
                    .chunks(chunk)
                    .map(|c| nested_literal(c, rest))
                    .collect()
            };
            format!("[{}]", rows.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(dims: &[i64]) -> TensorType {
        TensorType::new(ElementType::F32, dims)
    }

    #[test]
    fn types_print_as_mlir() {
        assert_eq!(f32s(&[2, 3]).to_string(), "tensor<2x3xf32>");
        assert_eq!(
            TensorType::scalar(ElementType::U32).to_string(),
            "tensor<ui32>"
        );
    }

    #[test]
    fn a_replicated_sum_module_prints_as_expected() {
        let mut b = Builder::new();
        let x = b.parameter(f32s(&[2]));
        let s = b
            .all_reduce(&x, AllReduceOp::Sum, &ReplicaGroups::all(2))
            .unwrap();
        let text = b.build("m", &[s], 2).unwrap().text().to_owned();
        let expected = "\
module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 2 : i32} {
  func.func public @main(%arg0: tensor<2xf32>) -> (tensor<2xf32>) {
    %3 = \"stablehlo.all_reduce\"(%arg0) ({
    ^bb0(%0: tensor<f32>, %1: tensor<f32>):
      %2 = \"stablehlo.add\"(%0, %1) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      \"stablehlo.return\"(%2) : (tensor<f32>) -> ()
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<2xf32>) -> tensor<2xf32>
    func.return %3 : tensor<2xf32>
  }
}
";
        assert_eq!(text, expected);
    }

    #[test]
    fn constants_nest_by_shape() {
        let mut b = Builder::new();
        let c = b
            .constant(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
            .unwrap();
        assert_eq!(c.ty(), &f32s(&[2, 3]));
        assert!(b.lines[0].contains("dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>"));
        let err = b.constant(&[1i32, 2], &[3]).unwrap_err().to_string();
        assert!(err.contains("needs 3 values, got 2"), "{err}");
    }

    #[test]
    fn shape_errors_name_the_op() {
        let mut b = Builder::new();
        let x = b.parameter(f32s(&[2, 3]));
        let y = b.parameter(f32s(&[3, 2]));
        let cases: Vec<(Result<Value>, &str)> = vec![
            (b.add(&x, &y), "stablehlo.add: operand types differ"),
            (b.reshape(&x, &[4]), "stablehlo.reshape"),
            (b.transpose(&x, &[0, 0]), "not a permutation"),
            (b.broadcast_in_dim(&x, &[2, 4], &[0, 1]), "cannot broadcast"),
            (b.matmul(&x, &x), "paired dimensions"),
            (b.all_gather(&x, 2, &ReplicaGroups::all(2)), "out of range"),
            (
                b.all_to_all(&x, 1, 0, &ReplicaGroups::all(2)),
                "divide by the group size",
            ),
        ];
        for (result, expected) in cases {
            let err = result.unwrap_err().to_string();
            assert!(err.contains(expected), "{err} should mention {expected}");
        }
    }

    #[test]
    fn result_shapes_follow_the_ops() {
        let mut b = Builder::new();
        let x = b.parameter(f32s(&[2, 3]));
        let w = b.parameter(f32s(&[3, 4]));
        assert_eq!(b.matmul(&x, &w).unwrap().ty(), &f32s(&[2, 4]));
        assert_eq!(b.transpose(&x, &[1, 0]).unwrap().ty(), &f32s(&[3, 2]));
        let zero = b.scalar(0.0f32);
        assert_eq!(
            b.reduce(&x, &zero, &[1], Reduction::Sum).unwrap().ty(),
            &f32s(&[2])
        );
        let groups = ReplicaGroups::all(4);
        assert_eq!(b.all_gather(&x, 0, &groups).unwrap().ty(), &f32s(&[8, 3]));
        let y = b.parameter(f32s(&[4, 2]));
        assert_eq!(
            b.all_to_all(&y, 0, 1, &groups).unwrap().ty(),
            &f32s(&[1, 8])
        );
        let v = b.parameter(f32s(&[3]));
        assert_eq!(
            b.broadcast_in_dim(&v, &[2, 3], &[1]).unwrap().ty(),
            &f32s(&[2, 3])
        );
        let p = b.compare(Comparison::Lt, &x, &x).unwrap();
        assert_eq!(p.ty().element, ElementType::Pred);
        assert_eq!(b.select(&p, &x, &x).unwrap().ty(), &f32s(&[2, 3]));
    }

    #[test]
    fn dynamic_slice_takes_one_start_per_dimension() {
        let mut b = Builder::new();
        let x = b.parameter(f32s(&[5, 3]));
        let i = b.scalar(2i32);
        let zero = b.scalar(0i32);
        assert_eq!(
            b.dynamic_slice(&x, &[&i, &zero], &[1, 3]).unwrap().ty(),
            &f32s(&[1, 3])
        );
        assert!(b.dynamic_slice(&x, &[&i], &[1, 3]).is_err());
        assert!(b.dynamic_slice(&x, &[&i, &zero], &[1, 4]).is_err());
    }

    #[test]
    fn replica_groups_must_be_disjoint_and_equal() {
        assert!(ReplicaGroups::new(vec![vec![0, 1], vec![2, 3]]).is_ok());
        assert!(ReplicaGroups::new(vec![vec![0, 1], vec![2]]).is_err());
        assert!(ReplicaGroups::new(vec![vec![0, 1], vec![1, 2]]).is_err());
        assert!(ReplicaGroups::new(vec![]).is_err());
    }

    #[test]
    fn while_checks_its_regions() {
        let mut b = Builder::new();
        let i = b.scalar(0i32);
        let err = b
            .while_loop(
                &[&i],
                |_, args| Ok(args[0].clone()),
                |_, args| Ok(args.to_vec()),
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("condition must return an i1 scalar"), "{err}");
    }
}
