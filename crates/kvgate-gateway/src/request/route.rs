//! The generation routes a client can call, the engine path each one is
//! forwarded to, and the API dialect each speaks (its error body and how
//! its streams end). Its own module because the request path and the
//! replica directory both name it.

use kvgate_openai::anthropic::{COUNT_TOKENS_PATH, MESSAGES_PATH};
use kvgate_openai::responses::RESPONSES_PATH;

/// The generation routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
    /// Anthropic's Messages API, as vLLM serves it.
    Messages,
    /// OpenAI's Responses API (`POST /v1/responses`), as vLLM serves it.
    Responses,
}

/// The API a route belongs to: what its error bodies and streams look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// OpenAI's: `{"error": {...}}`, streams end with `data: [DONE]`.
    OpenAi,
    /// Anthropic's: `{"type": "error", "error": {...}}`, streams end with
    /// an event named `message_stop` (or `error`).
    Anthropic,
    /// OpenAI's Responses API: OpenAI's error body; streams of named events
    /// that end with `response.completed` (`.incomplete`, `.failed`, or
    /// `error`), whose first `*.delta` event is the first token.
    Responses,
}

impl Api {
    /// The API of any client path (not only generation routes): Anthropic's
    /// for `/v1/messages` and `/v1/messages/count_tokens`, the Responses
    /// API's for `/v1/responses` and the paths below it.
    pub(crate) fn of_path(path: &str) -> Api {
        if path == MESSAGES_PATH || path == COUNT_TOKENS_PATH {
            Api::Anthropic
        } else if path == RESPONSES_PATH
            || path.strip_prefix(RESPONSES_PATH).is_some_and(|rest| rest.starts_with('/'))
        {
            Api::Responses
        } else {
            Api::OpenAi
        }
    }
}

impl Route {
    /// How many generation routes there are (per-route arrays).
    pub(crate) const COUNT: usize = 4;

    pub(crate) const ALL: [Route; Route::COUNT] =
        [Route::Chat, Route::Completions, Route::Messages, Route::Responses];

    /// The generation route a request path names, if any.
    pub(crate) fn of_path(path: &str) -> Option<Route> {
        Route::ALL.into_iter().find(|r| r.path() == path)
    }

    pub(crate) fn path(self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::Messages => MESSAGES_PATH,
            Route::Responses => RESPONSES_PATH,
        }
    }

    /// The `route` label of the metrics and the dashboard.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Completions => "completions",
            Route::Messages => "messages",
            Route::Responses => "responses",
        }
    }

    pub(crate) fn api(self) -> Api {
        match self {
            Route::Chat | Route::Completions => Api::OpenAi,
            Route::Messages => Api::Anthropic,
            Route::Responses => Api::Responses,
        }
    }

    /// Its index among [`Route::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            Route::Chat => 0,
            Route::Completions => 1,
            Route::Messages => 2,
            Route::Responses => 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_routes() {
        for (i, r) in Route::ALL.into_iter().enumerate() {
            assert_eq!(Route::of_path(r.path()), Some(r));
            assert_eq!(r.index(), i);
        }
        assert_eq!(Route::of_path("/v1/models"), None);
        assert_eq!(Route::of_path("/v1/completions/"), None);
        assert_eq!(Route::of_path("/v1/messages/count_tokens"), None);
        assert_eq!(Api::of_path("/v1/messages/count_tokens"), Api::Anthropic);
        assert_eq!(Api::of_path("/v1/messages"), Route::Messages.api());
        assert_eq!(Api::of_path("/tokenize"), Api::OpenAi);
        assert_eq!(Api::of_path("/v1/responses"), Route::Responses.api());
        assert_eq!(Api::of_path("/v1/responses/resp_1/cancel"), Api::Responses);
        assert_eq!(Api::of_path("/v1/responsesx"), Api::OpenAi);
        assert_eq!(Route::of_path("/v1/responses/resp_1"), None);
    }
}
