package dev.agentbox.model;

import com.fasterxml.jackson.annotation.JsonAnyGetter;
import com.fasterxml.jackson.annotation.JsonAnySetter;
import java.util.LinkedHashMap;
import java.util.Map;

/** A JSON object of a custom resource (its spec or status), every field kept as read. */
public class JsonObject {
  private final Map<String, Object> fields = new LinkedHashMap<>();

  @JsonAnyGetter
  public Map<String, Object> fields() {
    return fields;
  }

  @JsonAnySetter
  public void set(String name, Object value) {
    fields.put(name, value);
  }

  /** One field, or null. */
  public Object get(String name) {
    return fields.get(name);
  }
}
