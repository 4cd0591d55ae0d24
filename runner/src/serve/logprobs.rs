//! OpenAI's `logprobs`/`top_logprobs`: each generated token's log-probability under the
//! distribution it was picked from, the model's logits **after** the grammar mask (so a
//! constrained row's disallowed tokens have probability 0 and the allowed ones share all
//! of it) and **before** temperature (the model's own probabilities, as OpenAI and vLLM
//! report them whatever the sampling).

/// A picked token's log-probability and the most likely tokens at its position.
#[derive(Clone, Debug)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// At most the `top_logprobs` asked for, most likely first (ties: lower id first);
    /// tokens the mask ruled out are never among them.
    pub top: Vec<(u32, f32)>,
}

/// One position's log-softmax, kept until its token is picked.
pub struct Distribution {
    logits: Vec<f32>,
    log_total: f64,
}

impl Distribution {
    /// Of the (masked) `logits`; −∞ marks a token that may not come next.
    pub fn of(logits: &[f32]) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        Distribution {
            logits: logits.to_vec(),
            log_total: f64::from(max) + total.ln(),
        }
    }

    pub fn logprob(&self, token: u32) -> f32 {
        self.logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| {
                (f64::from(l) - self.log_total) as f32
            })
    }

    /// `token`'s log-probability and the `k` most likely tokens.
    pub fn picked(&self, token: u32, k: usize) -> TokenLogprobs {
        let mut order: Vec<u32> = (0..self.logits.len() as u32)
            .filter(|&t| self.logits[t as usize].is_finite())
            .collect();
        let by_logit = |a: &u32, b: &u32| {
            self.logits[*b as usize]
                .total_cmp(&self.logits[*a as usize])
                .then(a.cmp(b))
        };
        if k < order.len() {
            order.select_nth_unstable_by(k, by_logit);
            order.truncate(k);
        }
        order.sort_by(by_logit);
        TokenLogprobs {
            logprob: self.logprob(token),
            top: order.into_iter().map(|t| (t, self.logprob(t))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_are_the_masked_softmax_and_the_top_is_sorted() {
        let d = Distribution::of(&[1.0, 3.0, f32::NEG_INFINITY, 3.0, 0.0]);
        let total: f64 = [1.0f64, 3.0, 3.0, 0.0].iter().map(|l| l.exp()).sum();
        let want = (1.0 - total.ln()) as f32;
        assert!((d.logprob(0) - want).abs() < 1e-6);
        assert_eq!(d.logprob(2), f32::NEG_INFINITY);
        let p = d.picked(3, 3);
        let top: Vec<u32> = p.top.iter().map(|&(t, _)| t).collect();
        assert_eq!(top, [1, 3, 0]);
        assert_eq!(p.logprob, p.top[0].1);
        assert_eq!(
            d.picked(1, 10).top.len(),
            4,
            "the masked token is never offered"
        );
        assert!(d.picked(1, 0).top.is_empty());
    }
}
