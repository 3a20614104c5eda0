"""gpuplane.httpauth.review.RequestReviewer: the TokenReview and SubjectAccessReview it posts, and its answers read
as untrusted (a field of the wrong type is not authenticated, not allowed; a failed request is ReviewFailed)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.httpauth.review import Identity, RequestReviewer, ReviewFailed


class Api:
    """Answers each review with ``answers[kind]`` (or raises it), recording what was posted."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers
        self.posted: list[tuple[str, str, Any, float]] = []

    def request(self, method: str, path: str, *, body: Any = None, timeout_s: float = 30.0) -> Any:
        self.posted.append((method, path, body, timeout_s))
        answer = self.answers[body["kind"]]
        if isinstance(answer, Exception):
            raise answer
        return answer


USER = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u-1", "groups": ["g"], "extra": {"k": ["v"]}}


def test_the_reviews_posted_and_their_answers() -> None:
    api = Api(
        TokenReview={"status": {"authenticated": True, "user": USER}},
        SubjectAccessReview={"status": {"allowed": True}},
    )
    reviewer = RequestReviewer(api, timeout_s=3.0)
    who = reviewer.authenticate("tok")
    assert who == Identity(USER["username"], "u-1", ("g",), (("k", ("v",)),))
    assert reviewer.authorize(who, "get", "/metrics")
    (m1, p1, b1, t1), (m2, p2, b2, _) = api.posted
    assert (m1, p1, t1) == ("POST", "/apis/authentication.k8s.io/v1/tokenreviews", 3.0)
    assert b1["spec"] == {"token": "tok"}
    assert (m2, p2) == ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews")
    assert b2["spec"] == {
        "user": USER["username"],
        "uid": "u-1",
        "groups": ["g"],
        "extra": {"k": ["v"]},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }


@pytest.mark.parametrize(
    "token_answer",
    [
        {"status": {"authenticated": False, "user": USER}},
        {"status": {"authenticated": "true", "user": USER}},  # not a boolean
        {"status": {"authenticated": True, "user": "admin"}},
        {"status": []},
        [],
        None,
    ],
)
def test_an_answer_of_the_wrong_shape_is_not_authenticated(token_answer: Any) -> None:
    assert RequestReviewer(Api(TokenReview=token_answer)).authenticate("tok") is None


def test_allowed_only_when_the_answer_says_true_and_a_failed_request_is_review_failed() -> None:
    who = Identity("u")
    for answer in ({"status": {"allowed": "yes"}}, {"status": {}}, {"allowed": True}):
        assert not RequestReviewer(Api(SubjectAccessReview=answer)).authorize(who, "get", "/metrics")
    with pytest.raises(ReviewFailed, match="TokenReview failed: ConnectionError"):
        RequestReviewer(Api(TokenReview=ConnectionError("down"))).authenticate("tok")
    with pytest.raises(ReviewFailed, match="SubjectAccessReview failed"):
        RequestReviewer(Api(SubjectAccessReview=TimeoutError())).authorize(who, "get", "/metrics")
