//! The two generation routes a client can call, and the engine path each
//! one is forwarded to. Its own module because the request path and the
//! replica directory both name it.

/// The two generation routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
}

impl Route {
    /// The generation route a request path names, if any.
    pub(crate) fn of_path(path: &str) -> Option<Route> {
        [Route::Chat, Route::Completions].into_iter().find(|r| r.path() == path)
    }

    pub(crate) fn path(self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Completions => "completions",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_routes() {
        for r in [Route::Chat, Route::Completions] {
            assert_eq!(Route::of_path(r.path()), Some(r));
        }
        assert_eq!(Route::of_path("/v1/models"), None);
        assert_eq!(Route::of_path("/v1/completions/"), None);
    }
}
