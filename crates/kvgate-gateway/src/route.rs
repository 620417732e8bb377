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
