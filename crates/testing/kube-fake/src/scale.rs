//! The scale subresource (`/scale`) of custom resources whose CRD declares one
//! (`spec.versions[].subresources.scale`), as the CRD documentation describes it: GET answers an
//! `autoscaling/v1` `Scale` built from the object (`spec.replicas` from `specReplicasPath`,
//! `status.replicas` from `statusReplicasPath` or 0, `status.selector` from
//! `labelSelectorPath` or ""); PUT and PATCH (merge or JSON patch) of that `Scale` write only
//! its `spec.replicas` back to `specReplicasPath` of the object (a write of the main resource:
//! new resourceVersion, generation bump, watch event). A PUT whose `metadata.resourceVersion`
//! is stale is a 409 `Conflict`. Types without a declared scale subresource never reach this
//! module (their `/scale` is a 404).

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use serde_json::{Map, Value, json};

use crate::{ApiError, Body, CRD_GROUP, CRD_PLURAL, FakeApiServer, Route, Write, full, key};

/// Where a CRD's scale subresource reads and writes (JSON pointers).
#[derive(Debug, Clone)]
pub(crate) struct ScalePaths {
    spec: String,
    status: String,
    selector: Option<String>,
}

/// `.spec.replicas` → `/spec/replicas` (the simple paths a scale subresource allows).
fn pointer(json_path: &str) -> String {
    json_path.trim().replace('.', "/")
}

fn scale_of(obj: &Value, p: &ScalePaths) -> Result<Value, ApiError> {
    let replicas = obj
        .pointer(&p.spec)
        .and_then(Value::as_i64)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("the spec replicas field {:?} does not exist", p.spec),
            )
        })?;
    let status_replicas = obj.pointer(&p.status).and_then(Value::as_i64).unwrap_or(0);
    let selector = p
        .selector
        .as_ref()
        .and_then(|s| obj.pointer(s))
        .and_then(Value::as_str)
        .unwrap_or("");
    let meta = obj.get("metadata").cloned().unwrap_or_default();
    let mut m = Map::new();
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta.get(f) {
            m.insert(f.into(), v.clone());
        }
    }
    Ok(json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": m,
        "spec": {"replicas": replicas},
        "status": {"replicas": status_replicas, "selector": selector},
    }))
}

/// A merge patch that sets the value at `ptr` (a `/a/b` pointer) to `v`.
fn nested(ptr: &str, v: Value) -> Value {
    ptr.trim_start_matches('/')
        .rsplit('/')
        .fold(v, |acc, seg| json!({ seg: acc }))
}

impl FakeApiServer {
    /// The scale paths of `r`'s type, when a stored CRD declares a scale subresource for it.
    pub(crate) fn scale_paths(&self, r: &Route) -> Option<ScalePaths> {
        self.objects(CRD_GROUP, CRD_PLURAL).iter().find_map(|crd| {
            let s = |p: &str| crd.pointer(p).and_then(Value::as_str);
            if s("/spec/group") != Some(r.group.as_str())
                || s("/spec/names/plural") != Some(r.plural.as_str())
            {
                return None;
            }
            let v = crd
                .pointer("/spec/versions")?
                .as_array()?
                .iter()
                .find(|v| v.get("name").and_then(Value::as_str) == Some(r.version.as_str()))?;
            let sc = v.pointer("/subresources/scale")?;
            Some(ScalePaths {
                spec: pointer(sc.get("specReplicasPath")?.as_str()?),
                status: pointer(sc.get("statusReplicasPath")?.as_str()?),
                selector: sc
                    .get("labelSelectorPath")
                    .and_then(Value::as_str)
                    .map(pointer),
            })
        })
    }

    fn current(&self, r: &Route, name: &str) -> Result<Value, ApiError> {
        let main = Route {
            subresource: None,
            ..r.clone()
        };
        self.lock()
            .objects
            .get(&key(&main, name))
            .map(|s| s.object.clone())
            .ok_or_else(|| ApiError::not_found(r, name))
    }

    /// Serves `/scale` of `name` (see the module docs).
    pub(crate) fn scale(
        &self,
        method: &Method,
        r: &Route,
        name: &str,
        content_type: &str,
        body: &Bytes,
        p: &ScalePaths,
    ) -> Result<Response<Body>, ApiError> {
        let obj = self.current(r, name)?;
        let scale = scale_of(&obj, p)?;
        let parse = || -> Result<Value, ApiError> {
            serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("invalid JSON: {e}")))
        };
        let wanted = match *method {
            Method::GET => return Ok(full(StatusCode::OK, &scale)),
            Method::PUT => {
                let v = parse()?;
                let want = v
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str);
                let have = scale
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str);
                if want.is_some_and(|w| !w.is_empty()) && want != have {
                    return Err(ApiError::conflict(format!(
                        "Operation cannot be fulfilled on {}.{} \"{name}\": the object has been \
                         modified; please apply your changes to the latest version and try again",
                        r.plural, r.group
                    )));
                }
                v
            }
            Method::PATCH => {
                let mut v = scale.clone();
                match content_type.split(';').next().unwrap_or("").trim() {
                    "application/merge-patch+json" => json_patch::merge(&mut v, &parse()?),
                    "application/json-patch+json" => {
                        let patch: json_patch::Patch = serde_json::from_slice(body)
                            .map_err(|e| ApiError::bad(format!("invalid JSON patch: {e}")))?;
                        json_patch::patch(&mut v, &patch).map_err(|e| {
                            ApiError::new(
                                StatusCode::UNPROCESSABLE_ENTITY,
                                "Invalid",
                                format!("JSON patch failed: {e}"),
                            )
                        })?;
                    }
                    other => {
                        return Err(ApiError::new(
                            StatusCode::UNSUPPORTED_MEDIA_TYPE,
                            "UnsupportedMediaType",
                            format!("unsupported patch type {other:?}"),
                        ));
                    }
                }
                v
            }
            _ => {
                return Err(ApiError::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    format!("{method} is not supported on /scale"),
                ));
            }
        };
        let replicas = wanted
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    format!(
                        "Scale.autoscaling \"{name}\" is invalid: spec.replicas: Invalid value: \
                         must be a non-negative integer"
                    ),
                )
            })?;
        let main = Route {
            subresource: None,
            ..r.clone()
        };
        self.write(
            &main,
            name,
            &Default::default(),
            Write::MergePatch(nested(&p.spec, json!(replicas))),
        )?;
        Ok(full(StatusCode::OK, &scale_of(&self.current(r, name)?, p)?))
    }
}
