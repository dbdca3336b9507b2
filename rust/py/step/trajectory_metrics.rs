//! `rl.metric_util.compute_trajectory_metrics`: the groups read once,
//! summed per tag and for all.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyString, PyTuple, PyType};
use pyo3::{ffi, intern};

use super::{number, sequence, sequence_of, type_name, unsupported, Counts};
use crate::errors::{Location, StepName};
use crate::py::classes::Classes;
use crate::py::read::{Items, PairReader};
use crate::step::{summarize, GroupStats, KeyedValues, RewardSum, Summary};

/// Metric keys (exact strs) and the ids [`KeyedValues`] knows them by.
struct MetricKeys<'py> {
    ids: Bound<'py, PyDict>,
    names: Vec<Bound<'py, PyString>>,
}

impl<'py> MetricKeys<'py> {
    fn id(&mut self, key: &Bound<'py, PyAny>) -> PyResult<usize> {
        let Ok(name) = key.cast_exact::<PyString>() else {
            return Err(unsupported(format!("a metric key is a {}, not a str", type_name(key))));
        };
        if let Some(id) = self.ids.get_item(name)? {
            return id.extract();
        }
        let id = self.names.len();
        self.ids.set_item(name, id)?;
        self.names.push(name.clone());
        Ok(id)
    }
}

/// What the trajectory metrics read besides the groups: tinker's input
/// classes, the cookbook's own `TrajectoryGroup.get_total_rewards` (a group
/// whose class has it is summed here), numpy's scalar number types.
pub struct Reading<'a, 'py> {
    pub classes: &'a Classes<'py>,
    pub own_total_rewards: Option<&'a Bound<'py, PyAny>>,
    pub numpy_numbers: &'a Bound<'py, PyTuple>,
}

impl<'py> Reading<'_, 'py> {
    /// A metric's value as `np.mean` takes it: a Python or numpy real,
    /// read without running Python code (np.mean calls no `__float__`),
    /// and whether numpy averages it as a float64 (a Python number, a
    /// float subclass such as `np.float64`).
    fn metric_value(&self, value: &Bound<'py, PyAny>, at: Location) -> PyResult<(f64, bool)> {
        if let Some(n) = number(value) {
            return Ok((n.value, true));
        }
        // A float subclass is read by its stored value, numpy's own scalar
        // types by their C conversion.
        if value.is_instance_of::<PyFloat>() {
            return Ok((value.extract()?, true));
        }
        if self.numpy_scalar(value) {
            return Ok((value.extract()?, false));
        }
        Err(unsupported(format!("{at}: a metric value is a {}", type_name(value))))
    }

    /// Whether `value`'s type is one of numpy's own (static) scalar types
    /// under `numpy_numbers`. Its real type is asked, not `isinstance`
    /// (which reads a `__class__` property); a subclass made in Python may
    /// have a `__float__` of its own, and is left to the cookbook.
    fn numpy_scalar(&self, value: &Bound<'py, PyAny>) -> bool {
        let held = value.get_type();
        let ty = held.as_type_ptr();
        // SAFETY: `held` holds the type alive; reading its flags runs no code.
        if unsafe { ffi::PyType_HasFeature(ty, ffi::Py_TPFLAGS_HEAPTYPE) } != 0 {
            return false;
        }
        self.numpy_numbers.iter().any(|cls| {
            cls.cast::<PyType>().is_ok_and(|cls| {
                // SAFETY: both types are held alive (`held`, the tuple);
                // PyType_IsSubtype walks the MRO in C.
                unsafe { ffi::PyType_IsSubtype(ty, cls.as_type_ptr()) != 0 }
            })
        })
    }

    /// One metrics dict's values, `None` skipped as `dict_mean` skips it.
    fn add_metrics(
        &self,
        metrics: &Bound<'py, PyAny>,
        values: &mut KeyedValues,
        keys: &mut MetricKeys<'py>,
        pairs: &mut PairReader<'py>,
        at: Location,
    ) -> PyResult<()> {
        let Ok(metrics) = metrics.cast_exact::<PyDict>() else {
            return Err(unsupported(format!(
                "{at}: metrics are a {}, not a dict",
                type_name(metrics)
            )));
        };
        // Reading a value other than an exact number (a numpy scalar's
        // float) can run code that changes the dict: the reader takes the
        // rest of the pairs first. A str key is looked up in C.
        let quiet = |key: &Bound<'py, PyAny>, value: &Bound<'py, PyAny>| {
            key.is_exact_instance_of::<PyString>() && (value.is_none() || number(value).is_some())
        };
        pairs.for_each(metrics.as_any(), quiet, |key, value| {
            if !value.is_none() {
                let (value, as_numpy) = self.metric_value(&value, at)?;
                values.add(keys.id(&key)?, value, as_numpy);
            }
            Ok(())
        })
    }

    fn group(
        &self,
        group: &Bound<'py, PyAny>,
        g: usize,
        keys: &mut MetricKeys<'py>,
        pairs: &mut PairReader<'py>,
    ) -> PyResult<GroupStats> {
        let py = group.py();
        let trajectories = sequence_of(group, intern!(py, "trajectories_G"), "trajectories_G")?;
        let own_rewards = match self.own_total_rewards {
            Some(own) => group.get_type().getattr(intern!(py, "get_total_rewards"))?.is(own),
            None => false,
        };
        let final_rewards = if own_rewards {
            let final_rewards = sequence_of(group, intern!(py, "final_rewards_G"), "final_rewards_G")?;
            if final_rewards.len() != trajectories.len() {
                return Err(unsupported(format!(
                    "group {g}: trajectories_G and final_rewards_G differ in length"
                )));
            }
            Some(final_rewards)
        } else {
            None
        };
        let mut stats = GroupStats::default();
        let mut counts = Counts::default();
        let mut totals = Vec::with_capacity(trajectories.len());
        let mut totals_known = own_rewards;
        for t in 0..trajectories.len() {
            let transitions = sequence_of(&trajectories.get(t)?, intern!(py, "transitions"), "transitions")?;
            stats.trajectories += 1;
            stats.turns += transitions.len() as i64;
            let mut reward = RewardSum::default();
            for u in 0..transitions.len() {
                let at = Location::turn(g, t, u).named(StepName::Transition);
                let transition = transitions.get(u)?;
                counts.add_transition(&transition, self.classes, at)?;
                if totals_known {
                    match number(&transition.getattr(intern!(py, "reward"))?) {
                        Some(r) => reward.add(r),
                        None => totals_known = false,
                    }
                }
                let metrics = transition.getattr(intern!(py, "metrics"))?;
                self.add_metrics(&metrics, &mut stats.transition_metrics, keys, pairs, at)?;
            }
            if let (true, Some(final_rewards)) = (totals_known, &final_rewards) {
                match number(&final_rewards.get(t)?).and_then(|f| reward.total(f)) {
                    Some(total) => totals.push(total),
                    None => totals_known = false,
                }
            }
        }
        if !totals_known {
            // A sum whose rounding depends on CPython's sum(), or another
            // get_total_rewards: the group's own method says.
            totals.clear();
            let given = group.call_method0(intern!(py, "get_total_rewards"))?;
            let given = sequence(&given, "get_total_rewards()")?;
            for t in 0..given.len() {
                let total = number(&given.get(t)?)
                    .ok_or_else(|| unsupported(format!("group {g}: a total reward is not an int or float")))?;
                totals.push(total.value);
            }
        }
        stats.set_rewards(&totals);
        stats.ac_tokens = counts.sampled;
        stats.ob_tokens = counts.prompt;
        stats.cached_ob_tokens = counts.cached;
        let metrics = sequence_of(group, intern!(py, "metrics_G"), "metrics_G")?;
        for t in 0..metrics.len() {
            self.add_metrics(
                &metrics.get(t)?,
                &mut stats.trajectory_metrics,
                keys,
                pairs,
                Location::trajectory(g, t),
            )?;
        }
        Ok(stats)
    }
}

/// The groups each tag names, tags in order of first appearance, a group
/// once per time its taglist names the tag (the cookbook's `tag2trajgroups`
/// over `zip(taglist_P, trajectory_groups_P)`).
fn tag_members<'py>(taglists: &Items<'py>, n_groups: usize) -> PyResult<Vec<(Bound<'py, PyString>, Vec<usize>)>> {
    let py = taglists.py();
    let index = PyDict::new(py);
    let mut tags: Vec<(Bound<'py, PyString>, Vec<usize>)> = Vec::new();
    for g in 0..taglists.len().min(n_groups) {
        let taglist = sequence(&taglists.get(g)?, "taglist")?;
        for i in 0..taglist.len() {
            let tag = taglist.get(i)?;
            let Ok(tag) = tag.cast_exact::<PyString>() else {
                return Err(unsupported(format!(
                    "group {g}: a tag is a {}, not a str",
                    type_name(&tag)
                )));
            };
            let k = if let Some(k) = index.get_item(tag)? {
                k.extract()?
            } else {
                index.set_item(tag, tags.len())?;
                tags.push((tag.clone(), Vec::new()));
                tags.len() - 1
            };
            tags[k].1.push(g);
        }
    }
    Ok(tags)
}

/// A summary's metrics into `out` as `{prefix}{key}`: the base metrics,
/// then the metric means, then the by-group fractions, each `set` in the
/// order the cookbook's `dict.update`s make (a later key of the same name
/// replaces the value and keeps the place).
fn write_summary<'py>(out: &Bound<'py, PyDict>, prefix: &str, s: &Summary, keys: &MetricKeys<'py>) -> PyResult<()> {
    let py = out.py();
    let metrics = PyDict::new(py);
    metrics.set_item(intern!(py, "ac_tokens_per_turn"), s.ac_tokens_per_turn())?;
    metrics.set_item(intern!(py, "ob_tokens_per_turn"), s.ob_tokens_per_turn())?;
    metrics.set_item(intern!(py, "turns_per_episode"), s.turns_per_episode())?;
    metrics.set_item(intern!(py, "total_episodes"), s.episodes)?;
    metrics.set_item(intern!(py, "total_turns"), s.turns)?;
    metrics.set_item(intern!(py, "total_ac_tokens"), s.ac_tokens)?;
    metrics.set_item(intern!(py, "total_ob_tokens"), s.ob_tokens)?;
    metrics.set_item(intern!(py, "total_cached_ob_tokens"), s.cached_ob_tokens)?;
    metrics.set_item(intern!(py, "reward/total"), s.reward)?;
    for &(key, mean) in &s.metric_means {
        metrics.set_item(&keys.names[key], mean)?;
    }
    metrics.set_item(intern!(py, "by_group/frac_mixed"), s.frac_mixed)?;
    metrics.set_item(intern!(py, "by_group/frac_all_good"), s.frac_all_good)?;
    metrics.set_item(intern!(py, "by_group/frac_all_bad"), s.frac_all_bad)?;
    for (key, value) in metrics {
        let key = key.cast::<PyString>()?.to_str()?;
        out.set_item(format!("{prefix}{key}"), value)?;
    }
    Ok(())
}

pub fn trajectory_metrics<'py>(
    groups: &Bound<'py, PyAny>,
    taglists: &Bound<'py, PyAny>,
    reading: &Reading<'_, 'py>,
) -> PyResult<Bound<'py, PyDict>> {
    let py = groups.py();
    let groups = sequence(groups, "trajectory_groups_P")?;
    let taglists = sequence(taglists, "taglist_P")?;
    let mut keys = MetricKeys {
        ids: PyDict::new(py),
        names: Vec::new(),
    };
    let mut pairs = PairReader::default();
    let stats = (0..groups.len())
        .map(|g| reading.group(&groups.get(g)?, g, &mut keys, &mut pairs))
        .collect::<PyResult<Vec<_>>>()?;
    let summary = |members: &[usize]| {
        summarize(&stats, members)
            .ok_or_else(|| unsupported("a group has no trajectories (grp_rewards[0] raises)".into()))
    };
    let out = PyDict::new(py);
    let tags = tag_members(&taglists, groups.len())?;
    if tags.iter().any(|(_, members)| members.len() < groups.len()) {
        for (tag, members) in &tags {
            write_summary(&out, &format!("env/{}/", tag.to_str()?), &summary(members)?, &keys)?;
        }
    }
    let all: Vec<usize> = (0..groups.len()).collect();
    write_summary(&out, "env/all/", &summary(&all)?, &keys)?;
    Ok(out)
}
