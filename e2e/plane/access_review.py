"""SubjectAccessReviews for an identity: one (verb, group, resource, subresource) at a time, or a whole
intended matrix printed with the unexpected rows marked."""

from __future__ import annotations

from kubernetes import client


def access(
    api: client.ApiClient, user: str, key: tuple[str, str, str, str], namespace: str | None = None, name: str = ""
) -> bool:
    verb, group, resource, sub = key
    namespace = (
        namespace
        if namespace is not None
        else (
            ""
            if resource
            in {"nodes", "resourceslices", "deviceclasses", "customresourcedefinitions", "clusterkopfpeerings"}
            else "default"
        )
    )
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", "system:serviceaccounts:gpuplane-system", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb,
                group=group,
                resource=resource,
                subresource=sub or None,
                namespace=namespace or None,
                name=name or None,
            ),
        )
    )
    answer = client.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(answer.status and answer.status.allowed)


def matrix(api: client.ApiClient, user: str, want: dict[tuple[str, str, str, str], bool]) -> str:
    rows = []
    for key, expected in want.items():
        got = access(api, user, key)
        verb, group, resource, sub = key
        name = f"{resource}/{sub}" if sub else resource
        rows.append(
            f"{'ALLOW' if got else 'deny ':5} {verb:16} {group or 'core':28} {name}"
            + ("" if got == expected else "   <-- UNEXPECTED")
        )
    return "\n".join(rows)
