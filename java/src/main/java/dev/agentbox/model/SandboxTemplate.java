package dev.agentbox.model;

import io.fabric8.kubernetes.api.model.Namespaced;
import io.fabric8.kubernetes.client.CustomResource;
import io.fabric8.kubernetes.model.annotation.Group;
import io.fabric8.kubernetes.model.annotation.Kind;
import io.fabric8.kubernetes.model.annotation.Plural;
import io.fabric8.kubernetes.model.annotation.Version;

/**
 * The {@code SandboxTemplate} custom resource ({@code agentbox.dev/v1alpha1}), for fabric8's typed API:
 * {@code client.resources(SandboxTemplate.class)}. Spec and status are the CRD's JSON (docs/reference.md).
 */
@Group("agentbox.dev")
@Version("v1alpha1")
@Kind("SandboxTemplate")
@Plural("sandboxtemplates")
public class SandboxTemplate extends CustomResource<JsonObject, JsonObject> implements Namespaced {
  private static final long serialVersionUID = 1L;
}
