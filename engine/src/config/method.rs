//! What the driver that recorded a run means by the method. A run is driven
//! as it was recorded: `mass-engine/9` follows MASS as the articles describe
//! it (a self-judge without the hidden checks' output, no judgment of a
//! candidate identical to its champion, a delegation-neutral orchestrator,
//! ranking of finished runs only, external evaluation by judgments in random
//! order); runs of `mass-engine/8` and `/7` keep the behaviour they were
//! recorded with, so they still replay, resume, re-judge and fork exactly.

/// The method's version, from the recording driver. Not part of the
/// experiment's definition: it is the driver recorded in `run.started`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Method {
    /// The driver's number (`mass-engine/N`).
    pub version: u32,
}

/// The version new runs are recorded with.
pub const CURRENT: u32 = 10;

impl Default for Method {
    fn default() -> Method {
        Method { version: CURRENT }
    }
}

impl Method {
    /// The method of driver `mass-engine/N`; `None` for another name.
    pub fn of_driver(driver: &str) -> Option<Method> {
        let n = driver.strip_prefix("mass-engine/")?.parse().ok()?;
        Some(Method { version: n })
    }

    /// A run recorded before MASS fidelity (`mass-engine/8` and earlier):
    /// its judge saw the checks' output, identical candidates were judged,
    /// the orchestrator was told to delegate, halted and failed runs were
    /// ranked, external evaluation took two verdicts per pair in alternating order.
    pub fn legacy(&self) -> bool {
        self.version < 9
    }

    /// Whether the run's training data keeps the models' reasoning
    /// (`Message::reasoning`). Drivers before `mass-engine/9` dropped it from
    /// proxied conversations when building datasets, so their datasets, and
    /// the trainer requests that carry them, are rebuilt without it.
    pub fn keeps_reasoning(&self) -> bool {
        self.version >= 9
    }

    /// Whether the run's `mass.training` records carry the starting
    /// model's validation loss (v3, from `mass-engine/10`); earlier runs
    /// recorded v2, and their replays must write v2 again.
    pub fn records_base_loss(&self) -> bool {
        self.version >= 10
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drivers_name_their_method() {
        assert_eq!(Method::of_driver("mass-engine/10"), Some(Method::default()));
        assert!(!Method::of_driver("mass-engine/9").unwrap().legacy());
        assert!(!Method::of_driver("mass-engine/9")
            .unwrap()
            .records_base_loss());
        assert!(Method::default().records_base_loss());
        assert!(Method::of_driver("mass-engine/8").unwrap().legacy());
        assert!(Method::of_driver("mass-engine/7").unwrap().legacy());
        assert!(!Method::default().legacy());
        assert!(Method::default().keeps_reasoning());
        assert!(!Method::of_driver("mass-engine/8")
            .unwrap()
            .keeps_reasoning());
        assert_eq!(Method::of_driver("other/9"), None);
        assert_eq!(Method::of_driver("mass-engine/x"), None);
    }
}
