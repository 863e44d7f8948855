//! The web UI: a one-page app under `/ui/`, its files embedded in the binary. It reads the
//! same `/v1` API a client does (with the `X-Berth-Token` header when the user gave a token),
//! follows `GET /v1/event/stream` for live updates, and puts every value it shows into the page
//! as text, never as markup.
//!
//! The files are served without a token (they hold no data), each with its content type,
//! `Cache-Control: no-cache`, `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY` and a
//! [`CONTENT_SECURITY_POLICY`] that lets the page load scripts, styles and data from the agent
//! only (no inline script or style). `/` and `/ui` redirect to `/ui/`.

use axum::{
    Router,
    extract::Path,
    http::{HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

use super::ApiError;

/// Where the UI is served (its index; its files are under it).
pub const UI_PATH: &str = "/ui/";

/// The `Content-Security-Policy` of every UI file.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; style-src 'self'; script-src 'self'";

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file of the UI; `index.html` is also served at [`UI_PATH`].
const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("ui/index.html"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("ui/style.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("ui/favicon.svg"),
    },
    Asset {
        name: "app.js",
        content_type: JS,
        body: include_bytes!("ui/app.js"),
    },
    Asset {
        name: "api.js",
        content_type: JS,
        body: include_bytes!("ui/api.js"),
    },
    Asset {
        name: "dom.js",
        content_type: JS,
        body: include_bytes!("ui/dom.js"),
    },
    Asset {
        name: "feed.js",
        content_type: JS,
        body: include_bytes!("ui/feed.js"),
    },
    Asset {
        name: "logs.js",
        content_type: JS,
        body: include_bytes!("ui/logs.js"),
    },
    Asset {
        name: "views.js",
        content_type: JS,
        body: include_bytes!("ui/views.js"),
    },
];

/// The UI's routes; merged into [`super::router`]. They need no state.
pub(super) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { redirect(StatusCode::TEMPORARY_REDIRECT) }),
        )
        .route(
            "/ui",
            get(|| async { redirect(StatusCode::PERMANENT_REDIRECT) }),
        )
        .route("/ui/", get(|| async { asset("index.html") }))
        .route("/ui/{file}", get(file))
}

async fn file(name: Result<Path<String>, axum::extract::rejection::PathRejection>) -> Response {
    match name {
        Ok(Path(name)) => asset(&name),
        Err(_) => not_found(),
    }
}

/// The file `name` with its headers, or a 404 that does not repeat the name.
fn asset(name: &str) -> Response {
    let Some(a) = ASSETS.iter().find(|a| a.name == name) else {
        return not_found();
    };
    let mut resp = a.body.into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(a.content_type),
    );
    secure(headers);
    resp
}

fn not_found() -> Response {
    let mut resp = ApiError::NotFound("no such file of the web UI".into()).into_response();
    secure(resp.headers_mut());
    resp
}

fn redirect(status: StatusCode) -> Response {
    let mut resp = (status, [(header::LOCATION, UI_PATH)]).into_response();
    secure(resp.headers_mut());
    resp
}

/// The headers every answer of these routes carries.
fn secure(headers: &mut axum::http::HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    use super::*;

    async fn get(path: &str) -> Response {
        routes::<()>()
            .oneshot(
                axum::http::Request::get(path)
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("answer")
    }

    fn header<'a>(r: &'a Response, name: &str) -> &'a str {
        r.headers()
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header"))
            .to_str()
            .expect("text")
    }

    #[tokio::test]
    async fn every_file_is_served_with_its_type_and_the_security_headers() {
        for a in ASSETS {
            let r = get(&format!("/ui/{}", a.name)).await;
            assert_eq!(r.status(), StatusCode::OK, "{}", a.name);
            assert_eq!(header(&r, "content-type"), a.content_type);
            assert_eq!(
                header(&r, "content-security-policy"),
                CONTENT_SECURITY_POLICY
            );
            assert_eq!(header(&r, "x-content-type-options"), "nosniff");
            assert_eq!(header(&r, "cache-control"), "no-cache");
            let body = r.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&body[..], a.body, "{}", a.name);
        }
        let index = get("/ui/").await;
        assert_eq!(header(&index, "content-type"), "text/html; charset=utf-8");
    }

    #[tokio::test]
    async fn the_index_and_scripts_load_nothing_from_elsewhere() {
        for a in ASSETS {
            let text = std::str::from_utf8(a.body).expect("UTF-8");
            for banned in [
                "http://",
                "https://",
                "innerHTML",
                "outerHTML =",
                "eval(",
                "//cdn",
            ] {
                // The SVG names its XML namespace, which is never fetched.
                if a.name == "favicon.svg" && banned == "http://" {
                    continue;
                }
                assert!(!text.contains(banned), "{} contains {banned:?}", a.name);
            }
        }
        let index = std::str::from_utf8(ASSETS[0].body).expect("UTF-8");
        assert!(!index.contains("<script>"), "no inline script");
        assert!(!index.contains("style="), "no inline style");
    }

    #[tokio::test]
    async fn unknown_files_are_404_and_the_roots_redirect() {
        for path in ["/ui/nope.js", "/ui/..%2Fsecret", "/ui/%3Cscript%3E"] {
            let r = get(path).await;
            assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
            assert_eq!(header(&r, "x-content-type-options"), "nosniff");
            let body = r.into_body().collect().await.expect("body").to_bytes();
            let text = String::from_utf8_lossy(&body);
            assert!(
                !text.contains("script") && !text.contains("secret"),
                "{text}"
            );
        }
        let r = get("/ui").await;
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(header(&r, "location"), "/ui/");
        let r = get("/").await;
        assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(header(&r, "location"), "/ui/");
    }
}
