//! Typed helpers over [`GraphBuilder::op`], one per ai.onnx operator used.

use crate::builder::{Attr, GraphBuilder, Value};

impl GraphBuilder {
    pub fn matmul(&mut self, a: &Value, b: &Value) -> Value {
        self.op1("MatMul", &[a, b], vec![])
    }
    pub fn add(&mut self, a: &Value, b: &Value) -> Value {
        self.op1("Add", &[a, b], vec![])
    }
    pub fn sub(&mut self, a: &Value, b: &Value) -> Value {
        self.op1("Sub", &[a, b], vec![])
    }
    pub fn mul(&mut self, a: &Value, b: &Value) -> Value {
        self.op1("Mul", &[a, b], vec![])
    }
    pub fn div(&mut self, a: &Value, b: &Value) -> Value {
        self.op1("Div", &[a, b], vec![])
    }
    pub fn sigmoid(&mut self, x: &Value) -> Value {
        self.op1("Sigmoid", &[x], vec![])
    }
    pub fn sqrt(&mut self, x: &Value) -> Value {
        self.op1("Sqrt", &[x], vec![])
    }
    pub fn exp(&mut self, x: &Value) -> Value {
        self.op1("Exp", &[x], vec![])
    }
    /// `Reshape` to a constant shape (0 copies the input dimension, -1 is inferred).
    pub fn reshape(&mut self, x: &Value, shape: &[i64]) -> Value {
        let s = self.const_i64(shape);
        self.op1("Reshape", &[x, &s], vec![])
    }
    pub fn transpose(&mut self, x: &Value, perm: &[i64]) -> Value {
        self.op1("Transpose", &[x], vec![("perm", Attr::Ints(perm.to_vec()))])
    }
    pub fn concat(&mut self, xs: &[&Value], axis: i64) -> Value {
        self.op1("Concat", xs, vec![("axis", Attr::Int(axis))])
    }
    /// `Slice` along `axis` from `start` to `end` (constants; `i64::MAX` means to the end).
    pub fn slice(&mut self, x: &Value, axis: i64, start: i64, end: i64) -> Value {
        let (s, e, a) = (
            self.const_i64(&[start]),
            self.const_i64(&[end]),
            self.const_i64(&[axis]),
        );
        self.op1("Slice", &[x, &s, &e, &a], vec![])
    }
    /// `Slice` along `axis` from a runtime 1-D `start` to the end.
    pub fn slice_from(&mut self, x: &Value, axis: i64, start: &Value) -> Value {
        let (e, a) = (self.const_i64(&[i64::MAX]), self.const_i64(&[axis]));
        self.op1("Slice", &[x, start, &e, &a], vec![])
    }
    pub fn unsqueeze(&mut self, x: &Value, axes: &[i64]) -> Value {
        let a = self.const_i64(axes);
        self.op1("Unsqueeze", &[x, &a], vec![])
    }
    pub fn squeeze(&mut self, x: &Value, axes: &[i64]) -> Value {
        let a = self.const_i64(axes);
        self.op1("Squeeze", &[x, &a], vec![])
    }
    /// `Cast` to an ONNX data type.
    pub fn cast(&mut self, x: &Value, to: i32) -> Value {
        self.op1("Cast", &[x], vec![("to", Attr::Int(to as i64))])
    }
    pub fn gather(&mut self, data: &Value, indices: &Value, axis: i64) -> Value {
        self.op1("Gather", &[data, indices], vec![("axis", Attr::Int(axis))])
    }
    /// `ReduceMean` over `axes`, keeping them.
    pub fn reduce_mean(&mut self, x: &Value, axes: &[i64]) -> Value {
        let a = self.const_i64(axes);
        self.op1("ReduceMean", &[x, &a], vec![])
    }
    /// `ReduceMean` over `axes`, which the result drops.
    pub fn reduce_mean_dropping(&mut self, x: &Value, axes: &[i64]) -> Value {
        let a = self.const_i64(axes);
        self.op1("ReduceMean", &[x, &a], vec![("keepdims", Attr::Int(0))])
    }
    /// `ReduceSum` over `axes`, keeping them or not.
    pub fn reduce_sum(&mut self, x: &Value, axes: &[i64], keepdims: bool) -> Value {
        let a = self.const_i64(axes);
        self.op1(
            "ReduceSum",
            &[x, &a],
            vec![("keepdims", Attr::Int(keepdims as i64))],
        )
    }
    pub fn softmax(&mut self, x: &Value, axis: i64) -> Value {
        self.op1("Softmax", &[x], vec![("axis", Attr::Int(axis))])
    }
    pub fn where_(&mut self, cond: &Value, a: &Value, b: &Value) -> Value {
        self.op1("Where", &[cond, a, b], vec![])
    }
    /// Zero-pads `x` by `before` elements at the start of `axis` (rank `rank`).
    pub fn pad_front(&mut self, x: &Value, rank: usize, axis: usize, before: i64) -> Value {
        let mut pads = vec![0; 2 * rank];
        pads[axis] = before;
        let p = self.const_i64(&pads);
        self.op1("Pad", &[x, &p], vec![])
    }
    /// Zero-pads `x` by `after` elements at the end of `axis` (rank `rank`).
    pub fn pad_back(&mut self, x: &Value, rank: usize, axis: usize, after: i64) -> Value {
        let mut pads = vec![0; 2 * rank];
        pads[rank + axis] = after;
        let p = self.const_i64(&pads);
        self.op1("Pad", &[x, &p], vec![])
    }
    /// 1-D int64 shape of `x`, optionally restricted to `[start, end)`.
    pub fn shape_of(&mut self, x: &Value, start: i64, end: i64) -> Value {
        self.op1(
            "Shape",
            &[x],
            vec![("start", Attr::Int(start)), ("end", Attr::Int(end))],
        )
    }
}
