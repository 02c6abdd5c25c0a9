//! Taints and tolerations: which toleration tolerates which taint, as Kubernetes'
//! `Toleration.ToleratesTaint` decides.

use k8s_openapi::api::core::v1 as core;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl Effect {
    pub fn parse(s: &str) -> Option<Effect> {
        match s {
            "NoSchedule" => Some(Effect::NoSchedule),
            "PreferNoSchedule" => Some(Effect::PreferNoSchedule),
            "NoExecute" => Some(Effect::NoExecute),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: Effect,
}

impl Taint {
    /// `None` for a taint with an effect Kubernetes does not know (validation keeps those out).
    pub fn from_k8s(t: &core::Taint) -> Option<Taint> {
        Some(Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect: Effect::parse(&t.effect)?,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toleration {
    /// Empty with `exists` tolerates every key.
    pub key: String,
    pub exists: bool,
    pub value: String,
    /// `None` tolerates every effect.
    pub effect: Option<Effect>,
}

impl Toleration {
    pub fn from_k8s(t: &core::Toleration) -> Toleration {
        Toleration {
            key: t.key.clone().unwrap_or_default(),
            exists: t.operator.as_deref() == Some("Exists"),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.as_deref().and_then(Effect::parse),
        }
    }

    pub fn tolerates(&self, taint: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        if self.key != taint.key && !(self.key.is_empty() && self.exists) {
            return false;
        }
        self.exists || self.value == taint.value
    }
}

/// The first taint among those `considered` that no toleration tolerates.
pub fn first_untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    considered: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints.iter().filter(|t| considered(t)).find(|t| !tolerations.iter().any(|tol| tol.tolerates(t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: Effect) -> Taint {
        Taint { key: key.into(), value: value.into(), effect }
    }

    fn tol(key: &str, exists: bool, value: &str, effect: Option<Effect>) -> Toleration {
        Toleration { key: key.into(), exists, value: value.into(), effect }
    }

    #[test]
    fn equal_tolerations_need_the_same_key_value_and_effect() {
        let t = taint("dedicated", "gpu", Effect::NoSchedule);
        assert!(tol("dedicated", false, "gpu", Some(Effect::NoSchedule)).tolerates(&t));
        assert!(tol("dedicated", false, "gpu", None).tolerates(&t));
        assert!(!tol("dedicated", false, "cpu", None).tolerates(&t));
        assert!(!tol("dedicated", false, "gpu", Some(Effect::NoExecute)).tolerates(&t));
        assert!(!tol("other", false, "gpu", None).tolerates(&t));
    }

    #[test]
    fn exists_tolerates_any_value_and_an_empty_key_tolerates_every_taint() {
        let t = taint("dedicated", "gpu", Effect::NoExecute);
        assert!(tol("dedicated", true, "", None).tolerates(&t));
        assert!(tol("", true, "", None).tolerates(&t));
        assert!(!tol("", true, "", Some(Effect::NoSchedule)).tolerates(&t));
        // An empty key with Equal matches only an empty-keyed taint.
        assert!(!tol("", false, "gpu", None).tolerates(&t));
    }

    #[test]
    fn first_untolerated_skips_taints_not_considered() {
        let taints = vec![taint("soft", "", Effect::PreferNoSchedule), taint("hard", "x", Effect::NoSchedule)];
        let hard = |t: &Taint| t.effect != Effect::PreferNoSchedule;
        assert_eq!(first_untolerated(&taints, &[], hard).map(|t| t.key.as_str()), Some("hard"));
        assert!(first_untolerated(&taints, &[tol("hard", true, "", None)], hard).is_none());
    }
}
