//! Tensors between distribute and candle: the input pipeline's host tensors become candle tensors
//! on a replica's device ([`ToCandle`]), and gradients travel as distribute tensors.

use candle_core::{DType as CDType, Device};
use distribute_input::Masked;
use distribute_tensor::{DType, Element, Tensor};
use half::{bf16, f16};

use crate::Error;

/// A replica's input as candle values on the replica's device: what the step function of
/// [`DataParallel::run`](crate::DataParallel::run) receives.
///
/// Implemented for [`Tensor`] (to a `candle_core::Tensor` of the same dtype and shape), for
/// `()`, tuples of up to four, `Vec`s and `Option`s of convertible values, and for
/// [`Masked`] batches (`PartialBatch::PadWithMask`), which become [`CandleMasked`].
pub trait ToCandle {
    /// The candle form.
    type Candle;

    /// Converts `self`, placing every tensor on `device`.
    fn to_candle(self, device: &Device) -> Result<Self::Candle, Error>;
}

impl ToCandle for Tensor {
    type Candle = candle_core::Tensor;

    fn to_candle(self, device: &Device) -> Result<candle_core::Tensor, Error> {
        to_candle(&self, device)
    }
}

impl ToCandle for () {
    type Candle = ();

    fn to_candle(self, _: &Device) -> Result<(), Error> {
        Ok(())
    }
}

macro_rules! tuple_to_candle {
    ($($name:ident),+) => {
        impl<$($name: ToCandle),+> ToCandle for ($($name,)+) {
            type Candle = ($($name::Candle,)+);

            #[allow(non_snake_case)]
            fn to_candle(self, device: &Device) -> Result<Self::Candle, Error> {
                let ($($name,)+) = self;
                Ok(($($name.to_candle(device)?,)+))
            }
        }
    };
}
tuple_to_candle!(A);
tuple_to_candle!(A, B);
tuple_to_candle!(A, B, C);
tuple_to_candle!(A, B, C, D);

impl<A: ToCandle> ToCandle for Vec<A> {
    type Candle = Vec<A::Candle>;

    fn to_candle(self, device: &Device) -> Result<Self::Candle, Error> {
        self.into_iter().map(|a| a.to_candle(device)).collect()
    }
}

impl<A: ToCandle> ToCandle for Option<A> {
    type Candle = Option<A::Candle>;

    fn to_candle(self, device: &Device) -> Result<Self::Candle, Error> {
        self.map(|a| a.to_candle(device)).transpose()
    }
}

/// A padded batch and its mask as candle tensors: what a [`Masked`] input becomes.
#[derive(Debug, Clone)]
pub struct CandleMasked<B> {
    /// The batch, padded with rows of zeros.
    pub batch: B,
    /// `f32 [rows]`: 1.0 for a real row, 0.0 for padding.
    pub mask: candle_core::Tensor,
}

impl<B: ToCandle> ToCandle for Masked<B> {
    type Candle = CandleMasked<B::Candle>;

    fn to_candle(self, device: &Device) -> Result<Self::Candle, Error> {
        Ok(CandleMasked {
            batch: self.batch.to_candle(device)?,
            mask: self.mask.to_candle(device)?,
        })
    }
}

/// `tensor` as a candle tensor on `device`, same dtype and shape (one copy).
pub fn to_candle(tensor: &Tensor, device: &Device) -> Result<candle_core::Tensor, Error> {
    let host = tensor.to_host()?;
    let shape = host.shape().to_vec();
    fn make<T: Element + candle_core::WithDType>(
        host: &Tensor,
        shape: Vec<usize>,
        device: &Device,
    ) -> Result<candle_core::Tensor, Error> {
        let array = host.array::<T>()?;
        let tensor = match array.as_slice() {
            Some(slice) => candle_core::Tensor::from_slice(slice, shape, device)?,
            None => {
                let owned: Vec<T> = array.iter().copied().collect();
                candle_core::Tensor::from_vec(owned, shape, device)?
            }
        };
        Ok(tensor)
    }
    match host.dtype() {
        DType::F16 => make::<f16>(&host, shape, device),
        DType::BF16 => make::<bf16>(&host, shape, device),
        DType::F32 => make::<f32>(&host, shape, device),
        DType::F64 => make::<f64>(&host, shape, device),
        DType::I32 => make::<i32>(&host, shape, device),
        DType::I64 => make::<i64>(&host, shape, device),
    }
}

/// `tensor` (a candle tensor of a float or integer dtype) as a host tensor labelled `device`, same
/// dtype and shape; unsigned and 16-bit integers, which host tensors do not have, widened to
/// a signed dtype that holds every value: `U8` and `I16` to `I32`, `U32` to `I64`. So the `u8`
/// labels of candle's MNIST loader (`candle_datasets::vision::mnist`) feed a distributed
/// dataset as they are, and come to each replica's step as `I32`, which candle's losses and
/// `gather` take (`.to_dtype(DType::U8)` gives the bytes back, exactly).
pub fn from_candle(tensor: &candle_core::Tensor, device: &str) -> Result<Tensor, Error> {
    let shape = tensor.dims().to_vec();
    let flat = tensor.flatten_all()?;
    let tensor = match flat.dtype() {
        CDType::F16 => Tensor::from_vec(device, &shape, flat.to_vec1::<f16>()?)?,
        CDType::BF16 => Tensor::from_vec(device, &shape, flat.to_vec1::<bf16>()?)?,
        CDType::F32 => Tensor::from_vec(device, &shape, flat.to_vec1::<f32>()?)?,
        CDType::F64 => Tensor::from_vec(device, &shape, flat.to_vec1::<f64>()?)?,
        CDType::I32 => Tensor::from_vec(device, &shape, flat.to_vec1::<i32>()?)?,
        CDType::I64 => Tensor::from_vec(device, &shape, flat.to_vec1::<i64>()?)?,
        CDType::U8 | CDType::I16 => Tensor::from_vec(
            device,
            &shape,
            flat.to_dtype(CDType::I32)?.to_vec1::<i32>()?,
        )?,
        CDType::U32 => Tensor::from_vec(
            device,
            &shape,
            flat.to_dtype(CDType::I64)?.to_vec1::<i64>()?,
        )?,
        other => {
            return Err(Error::UnsupportedDType {
                what: "a tensor to move between replicas".into(),
                dtype: other,
                integers: true,
            });
        }
    };
    Ok(tensor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_goes_to_candle_and_back_unchanged() {
        let device = "/cpu:0";
        let cases = [
            Tensor::from_vec(device, &[2, 2], vec![1.5f32, -2.0, 0.0, 7.25]).unwrap(),
            Tensor::from_vec(device, &[3], vec![1.0f64, f64::MIN_POSITIVE, -0.0]).unwrap(),
            Tensor::from_vec(
                device,
                &[2],
                vec![bf16::from_f32(1.5), bf16::from_f32(-3.0)],
            )
            .unwrap(),
            Tensor::from_vec(device, &[2], vec![f16::from_f32(0.5), f16::from_f32(2.0)]).unwrap(),
            Tensor::from_vec(device, &[2, 1], vec![3i64, -9]).unwrap(),
            Tensor::from_vec(device, &[1], vec![42i32]).unwrap(),
        ];
        for tensor in cases {
            let candle = to_candle(&tensor, &Device::Cpu).unwrap();
            assert_eq!(candle.dims(), tensor.shape());
            let back = from_candle(&candle, device).unwrap();
            assert!(back.bitwise_eq(&tensor), "{tensor:?} came back as {back:?}");
        }
    }

    #[test]
    fn nested_inputs_and_masks_convert_leaf_by_leaf() {
        let x = Tensor::from_vec("/cpu:0", &[2, 1], vec![1.0f32, 2.0]).unwrap();
        let masked = Masked::pad(&(x.clone(),), 2, 3).unwrap();
        let converted = (x, Some(masked)).to_candle(&Device::Cpu).unwrap();
        assert_eq!(converted.0.to_vec2::<f32>().unwrap(), [[1.0], [2.0]]);
        let masked = converted.1.unwrap();
        assert_eq!(masked.mask.to_vec1::<f32>().unwrap(), [1.0, 1.0, 0.0]);
        assert_eq!(masked.batch.0.dims(), [3, 1]);
    }

    #[test]
    fn unsigned_labels_are_widened_to_a_signed_dtype_that_holds_every_value() {
        let bytes = candle_core::Tensor::new(&[0u8, 7, 255], &Device::Cpu).unwrap();
        let host = from_candle(&bytes, "/cpu:0").unwrap();
        assert_eq!(host.to_vec::<i32>().unwrap(), [0, 7, 255]);
        let back = to_candle(&host, &Device::Cpu).unwrap();
        assert_eq!(
            back.to_dtype(CDType::U8).unwrap().to_vec1::<u8>().unwrap(),
            [0, 7, 255]
        );
        let words = candle_core::Tensor::new(&[[u32::MAX], [9]], &Device::Cpu).unwrap();
        let host = from_candle(&words, "/cpu:0").unwrap();
        assert_eq!(host.shape(), [2, 1]);
        assert_eq!(host.to_vec::<i64>().unwrap(), [i64::from(u32::MAX), 9]);
    }

    #[test]
    fn an_unsupported_dtype_is_named() {
        let eight = candle_core::Tensor::new(&[1f32, 2.0], &Device::Cpu)
            .unwrap()
            .to_dtype(CDType::F8E4M3)
            .unwrap();
        let err = from_candle(&eight, "/cpu:0").unwrap_err();
        assert!(err.to_string().contains("F8E4M3"), "{err}");
    }
}
