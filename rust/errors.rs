//! The one error type for bad input: what is wrong, where, and which Python
//! exception class it becomes. Plain Rust; the conversion to a Python
//! exception lives in `py/errors.rs`.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Wrong kind of object (becomes `TypeError`).
    Type,
    /// Right kind, bad value or shape (becomes `ValueError`).
    Value,
    /// A row tinker-cookbook's data processing rejects with its
    /// `DataValidationError` (becomes `_core.ValidationError`, a `ValueError`
    /// the cookbook layer raises as that class).
    Validation,
}

/// What the API calls a trajectory's steps: evsys turns, cookbook transitions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StepName {
    #[default]
    Turn,
    Transition,
}

/// Where in the batch a problem is; parts left `None` are not printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Location {
    pub group: Option<usize>,
    pub trajectory: Option<usize>,
    pub turn: Option<usize>,
    pub step_name: StepName,
}

impl Location {
    pub const BATCH: Location = Location {
        group: None,
        trajectory: None,
        turn: None,
        step_name: StepName::Turn,
    };

    pub fn group(g: usize) -> Self {
        Location {
            group: Some(g),
            ..Self::BATCH
        }
    }

    pub fn trajectory(g: usize, t: usize) -> Self {
        Location {
            group: Some(g),
            trajectory: Some(t),
            ..Self::BATCH
        }
    }

    pub fn turn(g: usize, t: usize, u: usize) -> Self {
        Location {
            group: Some(g),
            trajectory: Some(t),
            turn: Some(u),
            step_name: StepName::Turn,
        }
    }

    /// The same place, with its steps named `name`.
    #[must_use]
    pub fn named(self, name: StepName) -> Self {
        Location {
            step_name: name,
            ..self
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = match self.step_name {
            StepName::Turn => "turn",
            StepName::Transition => "transition",
        };
        let parts = [
            ("group", self.group),
            ("trajectory", self.trajectory),
            (step, self.turn),
        ];
        let mut first = true;
        for (name, index) in parts {
            if let Some(i) = index {
                if !first {
                    f.write_str(", ")?;
                }
                write!(f, "{name} {i}")?;
                first = false;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputError {
    pub kind: ErrorKind,
    pub location: Location,
    pub message: String,
}

impl InputError {
    #[cold]
    pub fn new(kind: ErrorKind, location: Location, message: impl Into<String>) -> Self {
        InputError {
            kind,
            location,
            message: message.into(),
        }
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.location == Location::BATCH {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.location, self.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_starts_with_the_location() {
        let e = InputError::new(
            ErrorKind::Value,
            Location::turn(2, 1, 1),
            "token 2147483648 is outside 0..2147483647",
        );
        assert_eq!(
            e.to_string(),
            "group 2, trajectory 1, turn 1: token 2147483648 is outside 0..2147483647"
        );
        let e = InputError::new(ErrorKind::Value, Location::trajectory(0, 3), "reward nan is not finite");
        assert_eq!(e.to_string(), "group 0, trajectory 3: reward nan is not finite");
        let e = InputError::new(ErrorKind::Value, Location::group(4), "x");
        assert_eq!(e.to_string(), "group 4: x");
        let e = InputError::new(ErrorKind::Value, Location::BATCH, "x");
        assert_eq!(e.to_string(), "x");
        let at = Location::turn(0, 1, 2).named(StepName::Transition);
        assert_eq!(
            InputError::new(ErrorKind::Value, at, "x").to_string(),
            "group 0, trajectory 1, transition 2: x"
        );
    }
}
